"""Preset programs by name: each is ``run(ctx: RankContext) -> None``."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from shardtop.runner.context import RankContext

PROGRAMS: dict[str, str] = {
    "fsdp2-mlp": "shardtop.runner.programs.fsdp2_mlp:run",
    "zero3-linear": "shardtop.runner.programs.zero3_linear:run",
    "zero3-linear-fixed": "shardtop.runner.programs.zero3_linear:run",
    "fsdp-not-sharding": "shardtop.runner.programs.fsdp_story:run",
    "fsdp-auto-wrap": "shardtop.runner.programs.fsdp_story:run",
    "ddp-baseline": "shardtop.runner.programs.fsdp_story:run",
    "manual-placement": "shardtop.runner.programs.manual_placement:run",
}


def load_program(name: str) -> Callable[[RankContext], None]:
    module_name, _, func = PROGRAMS[name].partition(":")
    program: Callable[[RankContext], None] = getattr(importlib.import_module(module_name), func)
    return program
