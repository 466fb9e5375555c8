"""What a run was asked to do, resolved (``run.json``'s ``config``): one frozen record, made where it is decided.

``shardtop launch`` makes it from the resolved preset (``RunConfig.of``),
``shardtop rehearse`` adds what it rehearses (``RehearsalConfig``), and a
script's own run names its program and world size.  ``run_meta.py`` writes it
into ``run.json`` and reads it back; a field of the wrong shape reads as
missing, never as a crash later (``record_fields.py``).  The keys that belong
to one preset's program (``model``, ``batch_size``, ``max_steps``...) stay in
``settings``, as written, for that program and the plan.  No torch here, and
nothing else of shardtop.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Annotated, Any, Literal

import msgspec

from shardtop.rundir.engines import Engine
from shardtop.rundir.json_files import JsonObject
from shardtop.rundir.record_fields import read_fields

Accelerator = Literal["cpu", "cuda"]
"""Where a preset's ranks run, once the launcher resolved ``auto``."""

ACCELERATORS: tuple[Accelerator, ...] = ("cpu", "cuda")

Count = Annotated[int, msgspec.Meta(gt=0)]
"""A number of ranks, devices or bytes: a field of 0 or less reads as missing."""


class RehearsalConfig(msgspec.Struct, frozen=True, kw_only=True):
    """The ranks a rehearsal runs, one process per rank on one device, of a job of ``world_size``.

    What such a run shows is exactly what those ranks hold; nothing is known of
    the ranks not rehearsed, nor of anything that crosses ranks: the fake process
    group moves no data, and NCCL's own buffers and communicators do not exist.
    """

    world_size: int
    """The job's ranks."""
    ranks: tuple[int, ...]
    """The ranks rehearsed, in the order they run."""
    on: str = ""
    """What they run on: ``1 × NVIDIA H200``, ``CPU``."""

    @classmethod
    def parse(cls, raw: object) -> RehearsalConfig | None:
        """The section, or None where it is missing, of the wrong shape, or names no rank of the job."""
        if not isinstance(raw, Mapping):
            return None
        section = read_fields(_Section, raw)
        world = section.world_size
        kept = tuple(r for r in section.ranks if isinstance(r, int) and not isinstance(r, bool) and 0 <= r < world)
        return cls(world_size=world, ranks=kept, on=section.on) if kept else None

    @property
    def ranks_words(self) -> str:
        shown = ", ".join(str(r) for r in self.ranks)
        return f"{'rank' if len(self.ranks) == 1 else 'ranks'} {shown} of {self.world_size}"

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


class _Section(msgspec.Struct, frozen=True, kw_only=True):
    """A rehearsal section as written, before its ranks are checked against its world."""

    world_size: Count = 0
    ranks: tuple[Any, ...] = ()
    on: str = ""


class RunConfig(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """What a run was configured to do; every field optional, as a script's own run sets few."""

    program: str = ""
    """The program its ranks run: a preset's (``zero3-linear``) or the user's script's name."""
    preset: str = ""
    """The preset it runs; empty for a user's own script."""
    engine: Engine | None = None
    """The engine the preset trains with; None for a user's own script."""
    world_size: Count = 0
    """Ranks the launcher starts (0: not known, e.g. a script's own launcher)."""
    devices: Count = 0
    """Devices each run of the program drives (0: not known)."""
    accelerator: Accelerator | None = None
    gpu_mem_limit: Count | None = None
    """The per-process memory cap in bytes, if the run has one."""
    rehearsal: RehearsalConfig | None = None
    """Set where the run rehearses ranks of a larger job (``shardtop rehearse``)."""
    settings: Mapping[str, Any] = {}
    """Every key as written, for the preset's program and the plan (``run.json`` holds them beside the fields
    above, in one object)."""

    @classmethod
    def of(cls, settings: Mapping[str, Any]) -> RunConfig:
        """The config that ``settings`` (a resolved preset, ``config.resolve``) are: the fields shardtop reads
        taken from them, and all of them kept for the program.  A field of the wrong shape reads as missing."""
        read = read_fields(cls, settings, rehearsal=RehearsalConfig.parse, settings=None)
        return msgspec.structs.replace(read, settings=MappingProxyType(dict(settings)))

    @classmethod
    def parse(cls, raw: object) -> RunConfig:
        """``run.json``'s ``config`` as written; the empty config where it is not a JSON object."""
        return cls.of(raw) if isinstance(raw, Mapping) else cls()

    def as_json(self) -> JsonObject:
        """The object ``run.json`` holds: the settings, and the fields set here over them."""
        fields = msgspec.to_builtins(msgspec.structs.replace(self, settings={}))
        return {**self.settings, **fields}

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
