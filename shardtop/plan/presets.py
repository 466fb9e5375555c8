"""Plans of the presets from a model description in hand: torch-free, milliseconds.

The model description is the only costly part (the model is built on the
meta device and one forward pass is traced: ``shardtop.trace.presets``); it
depends only on a preset's program, model sizes and batch size
(``description_key``), so replanning with other devices, GPU or strategy
(``plan_described``) costs milliseconds.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from shardtop.config import ConfigError, flatten
from shardtop.plan.cards import Gpu
from shardtop.plan.compare import Plan, make_plan
from shardtop.plan.description import ModelDescription
from shardtop.plan.preset_strategies import PRESET_STRATEGIES

DescriptionKey = tuple[str, tuple[tuple[str, Any], ...], int]
"""(program, model sizes, batch size): what a preset's description depends on, and nothing else."""


def description_key(config: Mapping[str, Any]) -> DescriptionKey:
    """What ``describe_preset`` depends on: equal keys, equal descriptions (no torch)."""
    program = str(config["program"])
    if program not in PRESET_STRATEGIES:
        raise ConfigError(
            f"preset program {program!r} has no plan recipe; plannable: {', '.join(sorted(PRESET_STRATEGIES))}."
        )
    return program, tuple(sorted(flatten(config.get("model") or {}).items())), int(config["batch_size"])


def plan_described(
    config: Mapping[str, Any], desc: ModelDescription, *, devices: int, accelerator: str, gpu: Gpu | None
) -> Plan:
    """The plan of a preset whose description is in hand: pure and torch-free, milliseconds (a launch prompt
    replans on every key)."""
    asked = PRESET_STRATEGIES[str(config["program"])](config, desc, accelerator, devices)
    return make_plan(
        desc, asked, devices=devices, gpu=gpu, accelerator=accelerator, preset=str(config.get("preset", ""))
    )
