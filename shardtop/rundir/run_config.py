"""A run's configuration (``run.json``'s ``config``), parsed once into a frozen struct.

``shardtop launch`` writes the resolved preset there (``config.resolve``),
``shardtop rehearse`` adds its ``rehearsal`` section, and a script's own run
writes its program and world size.  The supervisor, each rank and every view
read it through ``RunConfig.parse``: a field of the wrong shape reads as
missing, never as a crash later.  The keys that belong to one preset's program
(``model``, ``batch_size``, ``max_steps``...) stay in ``settings``, as written,
for that program and the plan.  No torch here, and nothing else of shardtop.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Literal, TypeVar

Accelerator = Literal["cpu", "cuda"]
"""Where a preset's ranks run, once the launcher resolved ``auto``."""

ACCELERATORS: tuple[Accelerator, ...] = ("cpu", "cuda")

_Section = TypeVar("_Section", bound="RehearsalConfig")


@dataclass(frozen=True)
class RehearsalConfig:
    """The ranks a rehearsal runs, one process per rank on one device, of a job of ``world_size``."""

    world_size: int
    """The job's ranks."""
    ranks: tuple[int, ...]
    """The ranks rehearsed, in the order they run."""
    on: str = ""
    """What they run on: ``1 × NVIDIA H200``, ``CPU``."""

    @classmethod
    def parse(cls: type[_Section], raw: object) -> _Section | None:
        """The section, or None where it is missing, of the wrong shape, or names no rank of the job."""
        if not isinstance(raw, Mapping):
            return None
        world = count(raw.get("world_size"))
        ranks = raw.get("ranks")
        if not world or not isinstance(ranks, list):
            return None
        kept = tuple(r for r in ranks if isinstance(r, int) and not isinstance(r, bool) and 0 <= r < world)
        return cls(world_size=world, ranks=kept, on=text(raw.get("on"))) if kept else None


@dataclass(frozen=True)
class RunConfig:
    """What a run was configured to do; every field optional, as a script's own run sets few."""

    program: str = ""
    """The program its ranks run: a preset's (``zero3-linear``) or the user's script's name."""
    preset: str = ""
    """The preset it runs; empty for a user's own script."""
    world_size: int = 0
    """Ranks the launcher starts (0: not known, e.g. a script's own launcher)."""
    devices: int = 0
    """Devices each run of the program drives (0: not known)."""
    accelerator: Accelerator | None = None
    gpu_mem_limit: int | None = None
    """The per-process memory cap in bytes, if the run has one."""
    rehearsal: RehearsalConfig | None = None
    """Set where the run rehearses ranks of a larger job (``shardtop rehearse``)."""
    settings: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))
    """Every key as written, for the preset's program and the plan."""

    @classmethod
    def parse(cls, raw: object) -> RunConfig:
        if not isinstance(raw, Mapping):
            return cls()
        accelerator = raw.get("accelerator")
        return cls(
            program=text(raw.get("program")),
            preset=text(raw.get("preset")),
            world_size=count(raw.get("world_size")),
            devices=count(raw.get("devices")),
            accelerator=next((a for a in ACCELERATORS if a == accelerator), None),
            gpu_mem_limit=count(raw.get("gpu_mem_limit")) or None,
            rehearsal=RehearsalConfig.parse(raw.get("rehearsal")),
            settings=MappingProxyType(dict(raw)),
        )

    @property
    def rank_batches(self) -> list[list[int]]:
        """The ranks to start together: every rank at once, or, for a rehearsal, each rehearsed rank
        alone, one after another (they share the one device)."""
        if self.rehearsal is not None:
            return [[rank] for rank in self.rehearsal.ranks]
        return [list(range(self.world_size))]

    @property
    def first_rank(self) -> int:
        """The first rank the run starts: the one that plans it."""
        return self.rehearsal.ranks[0] if self.rehearsal is not None else 0


def text(value: object) -> str:
    return value if isinstance(value, str) else ""


def count(value: object) -> int:
    """A positive integer, or 0 for anything else."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0
