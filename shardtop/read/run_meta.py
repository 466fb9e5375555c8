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
from types import MappingProxyType
from typing import Any


@dataclass(frozen=True)
class Rehearsal:
    """A run that rehearses some ranks of a larger job, one process per rank on one device.

    What such a run shows is exactly what those ranks hold; nothing is known of
    the ranks not rehearsed, nor of anything that crosses ranks: the fake process
    group moves no data, and NCCL's own buffers and communicators do not exist.
    """

    world_size: int
    """The job's ranks."""
    ranks: tuple[int, ...]
    """The ranks rehearsed, in the order they ran."""
    on: str = ""
    """What they ran on: ``1 × NVIDIA H200``, ``CPU``."""

    @property
    def ranks_words(self) -> str:
        shown = ", ".join(str(r) for r in self.ranks)
        return f"rank{'s' if len(self.ranks) != 1 else ''} {shown} of {self.world_size}"

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

    @classmethod
    def parse(cls, raw: object) -> Rehearsal | None:
        if not isinstance(raw, Mapping):
            return None
        world = _count(raw.get("world_size"))
        ranks = raw.get("ranks")
        if not world or not isinstance(ranks, list):
            return None
        kept = tuple(r for r in ranks if isinstance(r, int) and not isinstance(r, bool) and 0 <= r < world)
        return cls(world_size=world, ranks=kept, on=_text(raw.get("on"))) if kept else None


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
    config: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))
    """The resolved preset configuration, for the report's record."""
    slurm_job_id: str = ""
    """SLURM's job and step where ``shardtop run`` (or the first rank) made the run ("" outside SLURM)."""
    slurm_step_id: str = ""
    rehearsal: Rehearsal | None = None
    """Set where the run rehearses ranks of a larger job (``shardtop rehearse``)."""

    @property
    def command_line(self) -> str:
        return shlex.join(self.command)

    @property
    def title(self) -> str:
        """The preset, or what a script run is: ``(own script)``."""
        return self.preset or self.program or "(own script)"

    @classmethod
    def parse(cls, raw: Mapping[str, Any]) -> RunMeta:
        config = raw.get("config")
        config = config if isinstance(config, Mapping) else {}
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
            program=_text(config.get("program")),
            command=command_words,
            created=_number(raw.get("created")),
            host=_text(raw.get("host")),
            user=_text(raw.get("user")),
            world_size=_count(config.get("world_size")),
            accelerator=_text(config.get("accelerator")),
            memory_limit=_count(config.get("gpu_mem_limit")) or None,
            external=raw.get("external") is True,
            config=MappingProxyType(dict(config)),
            slurm_job_id=_text(slurm.get("job_id")),
            slurm_step_id=_text(slurm.get("step_id")),
            rehearsal=Rehearsal.parse(config.get("rehearsal")),
        )


def _text(value: object) -> str:
    return value if isinstance(value, str) else ""


def _number(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value)


def _count(value: object) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0
