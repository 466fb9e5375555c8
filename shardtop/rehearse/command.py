"""``shardtop rehearse``: what was asked, started as one run per job size, followed or handed to the TUI."""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, TextIO

from shardtop.config import ConfigError
from shardtop.rehearse.spec import RehearsalSpec, parse_settings
from shardtop.runs import RunDirectory

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
) -> int | str:
    """Start the rehearsal; the exit code where it was followed here, else the run to open in the TUI."""
    spec, rest = parse_settings(settings)
    gpu, rest = _gpu_setting(rest)
    if command is not None and rest:
        raise ConfigError(
            f"{' '.join(rest)}: a command's rehearsal takes devices=N, rank=R and gpu=SIZE before --; "
            "its own settings go after -- as the command takes them."
        )
    if len(spec.worlds) > 1:
        from shardtop.rehearse.sweep import sweep

        return sweep(spec, rest, command, runs_dir=runs_dir, name=name, gpu=gpu, out=out)
    world = spec.worlds[0]
    started = start_one(spec, world, rest, command, runs_dir=runs_dir, name=name)
    if not headless:
        return str(started.path)
    return started.follow(out, every)


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


@dataclass(frozen=True)
class Started:
    """A rehearsal's run, started: a preset's (launched) or a command's (its supervisor), and how to
    follow it here to its end (returning the exit code)."""

    run: RunDirectory
    follow: Callable[[TextIO, int], int]

    @property
    def path(self) -> str:
        return str(self.run.path)


def start_one(
    spec: RehearsalSpec, world: int, settings: list[str], command: list[str] | None, *,
    runs_dir: str | None, name: str | None,
) -> Started:
    """One job size rehearsed as one run: each asked rank of it, one after another."""
    from shardtop.gpus import gpu_count

    ranks = spec.ranks_of(world)
    if command is not None:
        from shardtop.own_job.command import follow_command, start_command
        from shardtop.rehearse.start import device_words, first_gpu_name, rehearsal_section

        gpus = gpu_count()
        on = device_words(gpus, "cuda" if gpus else "cpu", first_gpu_name)
        job = start_command(command, runs_dir=runs_dir, name=name,
                            rehearsal=rehearsal_section(world, ranks, on))
        return Started(job.run, lambda out, every: follow_command(job, out, every=every))
    from shardtop.headless import follow
    from shardtop.launch import start
    from shardtop.rehearse.start import preset_config
    from shardtop.runs import ensure_root, runs_root

    config = preset_config(settings, world, ranks, gpu_count)
    root = ensure_root(runs_root(runs_dir))
    run = RunDirectory.create(
        root, config["preset"],
        {"config": config, "command": ["shardtop", "rehearse", *settings, f"devices={world}",
                                       "rank=" + ",".join(str(r) for r in ranks)]},
    )
    start(run)

    def follow_preset(out: TextIO, every: int) -> int:
        print(f"[{run.id}] rehearsing {config['preset']}: {config['rehearsal']['on']}, rank(s) "
              f"{', '.join(str(r) for r in ranks)} of {world}, one after another; run directory {run.path}",
              file=out, flush=True)
        return follow(run, out, every=every)

    return Started(run, follow_preset)
