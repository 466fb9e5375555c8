"""``shardtop rehearse``: what was asked, started as one run per job size, followed or handed to the TUI."""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, TextIO

from shardtop.config import ConfigError
from shardtop.rehearse.spec import parse_settings
from shardtop.rehearse.start import start_one

if TYPE_CHECKING:
    from shardtop.plan.cards import Gpu


def rehearse(
    settings: list[str],
    command: list[str] | None,
    *,
    runs_dir: str | None,
    name: str | None,
    headless: bool,
    every: int,
    out: TextIO = sys.stdout,
    watch: Callable[[str], int] | None = None,
) -> int:
    """Start the rehearsal and follow it to its end: here, one line per milestone, or, unless ``headless``,
    in ``watch`` (the TUI, given the run's directory).  Returns the exit code."""
    spec, rest = parse_settings(settings)
    gpu, rest = _gpu_setting(rest)
    mem_limit: int | None = None
    if command is not None:
        mem_limit, rest = _mem_limit_setting(rest)
    if command is not None and rest:
        raise ConfigError(
            f"{' '.join(rest)}: a command's rehearsal takes devices=N, rank=R, gpu=SIZE and gpu_mem_limit=SIZE "
            "before --; its own settings go after -- as the command takes them."
        )
    if len(spec.worlds) > 1:
        from shardtop.rehearse.sweep import sweep

        return sweep(spec, rest, command, runs_dir=runs_dir, name=name, gpu=gpu, out=out, mem_limit=mem_limit)
    world = spec.worlds[0]
    started = start_one(spec, world, rest, command, runs_dir=runs_dir, name=name, mem_limit=mem_limit)
    if headless or watch is None:
        return started.follow(out, every)
    return watch(started.path)


def _mem_limit_setting(rest: list[str]) -> tuple[int | None, list[str]]:
    """``gpu_mem_limit=SIZE`` for a command's ranks (a preset's is one of its settings), taken out."""
    from shardtop.config import parse_limit

    kept: list[str] = []
    limit: int | None = None
    for arg in rest:
        key, eq, value = arg.partition("=")
        if eq and key.strip() == "gpu_mem_limit":
            limit = parse_limit(value)
        else:
            kept.append(arg)
    return limit, kept


def _gpu_setting(rest: list[str]) -> tuple[Gpu | None, list[str]]:
    """``gpu=SIZE|CARD`` (what the job's GPUs hold, to judge what fits), taken out of the settings."""
    from shardtop.plan.cards import UnknownGpu, parse_gpu

    kept: list[str] = []
    gpu: Gpu | None = None
    for arg in rest:
        key, eq, value = arg.partition("=")
        if eq and key.strip() == "gpu":
            try:
                gpu = parse_gpu(value)
            except UnknownGpu as e:
                raise ConfigError(str(e)) from None
        else:
            kept.append(arg)
    return gpu, kept
