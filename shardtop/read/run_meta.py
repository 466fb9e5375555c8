"""``run.json`` parsed once into a frozen struct: what every view reads about a run.

The launcher, ``shardtop run`` and ranks that create a run themselves write
``run.json`` as a plain JSON object (``RunDirectory.write_meta``).  Readers
never ``meta.get("…")`` it: they parse it here, once, and a field of the
wrong shape reads as missing instead of breaking a view.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from shardtop.rundir.run_config import RehearsalConfig, RunConfig
from shardtop.rundir.run_config import text as _text
from shardtop.words import noun


class Rehearsal(RehearsalConfig):
    """A run that rehearses some ranks of a larger job, one process per rank on one device.

    What such a run shows is exactly what those ranks hold; nothing is known of
    the ranks not rehearsed, nor of anything that crosses ranks: the fake process
    group moves no data, and NCCL's own buffers and communicators do not exist.
    """

    @property
    def ranks_words(self) -> str:
        shown = ", ".join(str(r) for r in self.ranks)
        return f"{noun(len(self.ranks), 'rank')} {shown} of {self.world_size}"

    @property
    def headline(self) -> str:
        """``rank 0 of 6, rehearsed on 1 × NVIDIA H200; collectives not run``."""
        on = f" on {self.on}" if self.on else ""
        return f"{self.ranks_words}, rehearsed{on}; collectives not run"

    @property
    def caveat(self) -> str:
        """What a rehearsal cannot show, said wherever its figures are."""
        return (
            "Rehearsed through a fake process group: each rehearsed rank holds exactly what it would in the "
            f"job of {self.world_size}, but no data crossed ranks (losses, gradient norms and so clipping, "
            "loss-scale skips and routing are each rank's own), NCCL's buffers and communicators were not made, "
            "and ranks not rehearsed were not run."
        )


@dataclass(frozen=True)
class RankProcess:
    """A rank's process as the launcher recorded it when it started the rank (before the rank says hello)."""

    rank: int
    pid: int
    started: float | None
    """The process's start time (with the pid, it tells the process from a later one given the same pid)."""


@dataclass(frozen=True)
class RunMeta:
    """What a run's ``run.json`` says; every field optional, as old and external runs lack some."""

    id: str = ""
    preset: str = ""
    """The preset it runs; empty for a user's own script."""
    program: str = ""
    command: tuple[str, ...] = ()
    created: float | None = None
    host: str = ""
    user: str = ""
    world_size: int = 0
    """Ranks the launcher started (0: not known, e.g. a script's own launcher)."""
    accelerator: str = ""
    memory_limit: int | None = None
    """The per-process cap (``gpu_mem_limit``) the run was given."""
    external: bool = False
    """Created by the ranks of a script rather than by ``shardtop launch``."""
    config: RunConfig = field(default_factory=RunConfig)
    """The run's configuration, for the report's record."""
    slurm_job_id: str = ""
    """SLURM's job and step where ``shardtop run`` (or the first rank) made the run ("" outside SLURM)."""
    slurm_step_id: str = ""
    rehearsal: Rehearsal | None = None
    """Set where the run rehearses ranks of a larger job (``shardtop rehearse``)."""
    rank_processes: tuple[RankProcess, ...] = ()
    """The ranks' processes the launcher started, on ``host`` (none for a script's own launcher)."""

    @property
    def command_line(self) -> str:
        return shlex.join(self.command)

    @property
    def title(self) -> str:
        """The preset, or what a script run is: ``(own script)``."""
        return self.preset or self.program or "(own script)"

    @classmethod
    def parse(cls, raw: Mapping[str, Any]) -> RunMeta:
        config = RunConfig.parse(raw.get("config"))
        slurm = raw.get("slurm")
        slurm = slurm if isinstance(slurm, Mapping) else {}
        command = raw.get("command")
        if isinstance(command, str):
            command_words: tuple[str, ...] = (command,)
        elif isinstance(command, list):
            command_words = tuple(str(c) for c in command)
        else:
            command_words = ()
        return cls(
            id=_text(raw.get("id")),
            preset=_text(raw.get("preset")) if raw.get("preset") not in (None, "?") else "",
            program=config.program,
            command=command_words,
            created=_number(raw.get("created")),
            host=_text(raw.get("host")),
            user=_text(raw.get("user")),
            world_size=config.world_size,
            accelerator=config.accelerator or "",
            memory_limit=config.gpu_mem_limit,
            external=raw.get("external") is True,
            config=config,
            slurm_job_id=_text(slurm.get("job_id")),
            slurm_step_id=_text(slurm.get("step_id")),
            rehearsal=Rehearsal(r.world_size, r.ranks, r.on) if (r := config.rehearsal) is not None else None,
            rank_processes=_rank_processes(raw.get("rank_pids")),
        )


def _rank_processes(raw: object) -> tuple[RankProcess, ...]:
    """``rank_pids``: entries of the wrong shape are left out."""
    if not isinstance(raw, list):
        return ()
    out = []
    for entry in raw:
        if not isinstance(entry, Mapping):
            continue
        rank, pid = entry.get("rank"), entry.get("pid")
        if isinstance(rank, int) and isinstance(pid, int) and not isinstance(rank, bool) and pid > 0:
            out.append(RankProcess(rank, pid, _number(entry.get("started"))))
    return tuple(out)


def _number(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value)

