"""Evidence pieces several rules share, read from the ``RunModel``.

The facts themselves (engine, holdings, OOMs, the repeated block) are the
read model's (``shardtop.read.run_model``); this module only packs the parts a
finding's words need into small frozen records, so a rule's words depend on
its evidence alone.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from shardtop.read.memory_kinds import bytes_by_kind, kinds_sentence
from shardtop.read.oom_story import OomStory
from shardtop.read.other_parts import parts_dict, running_forward
from shardtop.read.run_model import RunModel
from shardtop.rundir.engines import DDP, FSDP1, FSDP2, ZERO1, ZERO2, ZERO3
from shardtop.rundir.events import Oom, PhaseName
from shardtop.rundir.memory_figures import MemorySplit
from shardtop.units import format_bytes

ENGINE_WORDS = {
    FSDP1: "FSDP",
    FSDP2: "FSDP2 (fully_shard)",
    ZERO1: "DeepSpeed ZeRO-1",
    ZERO2: "DeepSpeed ZeRO-2",
    ZERO3: "DeepSpeed ZeRO-3",
    DDP: "DDP",
}

Driver = Literal["lightning", "raw", "unknown"]
"""How the run drives the engine: through a Lightning Trainer, directly, or not recorded."""


def fmt(n: int | float | None) -> str:
    return format_bytes(n)


def driver_of(m: RunModel) -> Driver:
    if m.lightning:
        return "lightning"
    return "raw" if m.driver else "unknown"


@dataclass(frozen=True)
class KindsEvidence:
    """What filled a rank's allocated memory at one moment, by kind (``MemorySplit``), in bytes."""

    allocated: int | None
    by_kind: dict[str, int | None]
    unexplained: int | None
    phase: str
    step: int | None
    other_parts: dict[str, int] = field(default_factory=dict)
    """What ``other`` holds, by part (``read/other_parts.py``): those the split or its places name."""
    running_forward: bool = False
    """The moment is inside a module's forward (``read/other_parts.running_forward``): ``other``'s forward part
    is what the forward running then was making."""

    @classmethod
    def of(cls, split: MemorySplit | None, oom: Oom | None = None) -> KindsEvidence | None:
        """The evidence of ``split``, a moment inside a forward where it is ``oom``'s, raised in one."""
        if split is None:
            return None
        return cls(split.allocated, bytes_by_kind(split), split.unexplained, split.phase, split.step,
                   parts_dict(split), running_forward(split, oom))

    @property
    def when(self) -> str:
        """`` (step 0, setup)``, or nothing when the moment is not known."""
        return f" (step {self.step}, {self.phase})" if self.phase and self.step is not None else ""

    def sentence(self, requested: int | None = None) -> str:
        return kinds_sentence(self.allocated, self.by_kind, self.unexplained, requested,
                              other_parts=self.other_parts, running=self.running_forward)


@dataclass(frozen=True)
class OomEvidence:
    """The OOM a finding explains, as the read model tells it (``OomStory``)."""

    rank: int
    device: str
    phase: str
    step: int
    module: str | None
    module_type: str | None
    attributed_by: str
    engine_step: str | None
    requested_bytes: int | None
    allocated: int | None
    reserved: int | None
    limit: int | None
    total: int | None
    ranks_out_of_memory: int
    """How many ranks ran out of memory (this one included)."""

    @classmethod
    def of(cls, story: OomStory, ranks_out_of_memory: int = 1) -> OomEvidence:
        o = story.oom
        return cls(
            rank=o.rank,
            device=o.device,
            phase=o.phase,
            step=o.step,
            module=o.module,
            module_type=story.module_type,
            attributed_by=o.attributed_by,
            engine_step=o.engine_step,
            requested_bytes=o.requested_bytes,
            allocated=o.allocated,
            reserved=o.reserved,
            limit=o.limit,
            total=o.total,
            ranks_out_of_memory=ranks_out_of_memory,
        )

    @property
    def cap(self) -> int | None:
        """The memory the rank could use: its limit, else the device's total."""
        return self.limit or self.total

    def held_words(self) -> str:
        """``asking for 2 MiB with 15 GiB already allocated of a 15 GiB limit``."""
        asked = f", asking for {fmt(self.requested_bytes)}" if self.requested_bytes else ""
        had = f" with {fmt(self.allocated)} already allocated" if self.allocated else ""
        cap = f" of a {fmt(self.limit)} limit" if self.limit else ""
        return asked + had + cap


def first_oom_evidence(m: RunModel, phases: tuple[PhaseName, ...] = ()) -> OomEvidence | None:
    """The first OOM (in ``phases``, if given) as evidence."""
    for story in m.ooms:
        if not phases or story.oom.phase in phases:
            return OomEvidence.of(story, len(m.ooms))
    return None


def oom_avoided_by(m: RunModel, freed_bytes: int, phases: tuple[PhaseName, ...]) -> OomEvidence | None:
    """The first OOM in ``phases`` that freeing ``freed_bytes`` on its rank would have avoided:
    it asked for no more than that (an OOM whose request is not known is not claimed)."""
    found = first_oom_evidence(m, phases)
    if found is None or not found.requested_bytes or found.requested_bytes > freed_bytes:
        return None
    return found


ITEMSIZES = {"float64": 8, "float32": 4, "bfloat16": 2, "float16": 2, "float8_e4m3fn": 1, "float8_e5m2": 1}
"""Bytes per element of the dtypes a unit may report (``Unit.dtype``)."""
