"""A preset or a command rehearsed as a run: its config, its run directory, its supervisor.

The run's config says what it rehearses (``config.rehearsal``: the job's world
size, the ranks rehearsed, the device they ran on); ``world_size`` is the job's,
so every rank's events, the plan and the report count in the job's terms.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass
from typing import TextIO

import msgspec

from shardtop.config import ConfigError, apply_cpu_defaults, resolve, split_overrides
from shardtop.launch import missing_engines
from shardtop.rehearse.spec import RehearsalSpec
from shardtop.rundir.json_files import JsonObject
from shardtop.rundir.run_config import RehearsalConfig, RunConfig
from shardtop.rundir.run_directory import RunDirectory

CPU = "CPU"


def device_words(gpus: int, accelerator: str, name: Callable[[], str]) -> str:
    """What the rehearsed ranks run on, in a user's words: ``1 × NVIDIA H200`` or ``CPU``."""
    if accelerator != "cuda" or gpus == 0:
        return CPU
    return f"1 × {name() or 'GPU'}"


def first_gpu_name() -> str:
    from shardtop.gpus import GpuUnavailable, Nvml

    try:
        gpus = Nvml().sample(with_processes=False)
    except GpuUnavailable:
        return ""
    return gpus[0].name if gpus else ""


def preset_config(
    settings: list[str], world: int, ranks: tuple[int, ...], gpu_count: Callable[[], int],
    gpu_name: Callable[[], str] = first_gpu_name,
) -> JsonObject:
    """The resolved config of a preset rehearsed as ``ranks`` of a job of ``world`` devices, as ``run.json``
    holds it (``preset_run_config``'s)."""
    return preset_run_config(settings, world, ranks, gpu_count, gpu_name).as_json()


def preset_run_config(
    settings: list[str], world: int, ranks: tuple[int, ...], gpu_count: Callable[[], int],
    gpu_name: Callable[[], str] = first_gpu_name,
) -> RunConfig:
    """The resolved config of a preset rehearsed as ``ranks`` of a job of ``world`` devices."""
    preset, overrides = split_overrides(settings)
    config = resolve(preset, [*overrides, ("devices", str(world))])
    if config.get("single_process"):
        raise ConfigError(
            f"{config['preset']} drives every GPU from one process (manual placement): it has no rank to "
            f"rehearse. Plan it instead: shardtop plan {config['preset']} devices={world}"
        )
    missing = missing_engines(str(config.get("engine", "")))
    if missing:
        raise ConfigError(
            f"the presets train with {', '.join(missing)}, which this Python does not have. "
            "Install them with: pip install 'shardtop[engines]'"
        )
    config = copy.deepcopy(config)
    gpus = gpu_count()
    accelerator = str(config.get("accelerator", "auto"))
    if accelerator == "auto":
        accelerator = "cuda" if gpus > 0 else "cpu"
    if accelerator == "cuda" and gpus == 0:
        raise ConfigError(
            "accelerator=cuda, but no NVIDIA GPU is visible (no driver, or CUDA_VISIBLE_DEVICES hides them).\n"
            "Use accelerator=cpu (or auto) to rehearse on a CPU process."
        )
    if accelerator == "cpu":
        config = apply_cpu_defaults(config)
    config["accelerator"] = accelerator
    config["devices"] = world
    config["world_size"] = world
    rehearsal = RehearsalConfig(world_size=world, ranks=ranks, on=device_words(gpus, accelerator, gpu_name))
    return msgspec.structs.replace(RunConfig.of(config), rehearsal=rehearsal)


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
    runs_dir: str | None, name: str | None, mem_limit: int | None = None,
) -> Started:
    """One job size rehearsed as one run: each asked rank of it, one after another.  ``mem_limit``: a
    command's ranks capped at that many bytes (a preset's cap is its ``gpu_mem_limit`` setting)."""
    from shardtop.gpus import gpu_count

    ranks = spec.ranks_of(world)
    if command is not None:
        from shardtop.own_job.command import follow_command, start_command

        gpus = gpu_count()
        on = device_words(gpus, "cuda" if gpus else "cpu", first_gpu_name)
        rehearsal = RehearsalConfig(world_size=world, ranks=ranks, on=on)
        job = start_command(command, runs_dir=runs_dir, name=name, rehearsal=rehearsal, mem_limit=mem_limit)
        return Started(job.run, lambda out, every: follow_command(job, out, every=every))
    from shardtop.headless import follow
    from shardtop.launch import create_run, start
    from shardtop.rundir.run_directory import runs_root

    config = preset_run_config(settings, world, ranks, gpu_count)
    on = config.rehearsal.on if config.rehearsal is not None else ""
    run = create_run(runs_root(runs_dir), config, ["shardtop", "rehearse", *settings, f"devices={world}",
                                                   "rank=" + ",".join(str(r) for r in ranks)])
    start(run)

    def follow_preset(out: TextIO, every: int) -> int:
        print(f"[{run.id}] rehearsing {config.preset}: {on}, rank(s) "
              f"{', '.join(str(r) for r in ranks)} of {world}, one after another; run directory {run.path}",
              file=out, flush=True)
        return follow(run, out, every=every)

    return Started(run, follow_preset)
