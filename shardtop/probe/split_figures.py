"""The figures a memory split is made of: what is left unexplained, which of two peaks to keep, which
kinds a split can say it measured.  Pure functions over ``MemoryKinds`` and ``MemorySplit``."""

from __future__ import annotations

import msgspec

from shardtop.probe.allocator_trace import TRACE_KINDS, BlockSplit
from shardtop.rundir.memory_figures import MemoryKinds, MemorySplit, OtherParts


def unexplained(allocated: int | None, kinds: MemoryKinds) -> int | None:
    if allocated is None:
        return None
    return allocated - sum(getattr(kinds, kind) or 0 for kind in TRACE_KINDS)


PEAK_SAME = 0.05
"""Two peaks within 5 % of each other are the same peak, seen at different steps."""


def with_lasting_workspaces(kinds: MemoryKinds, allocated: int | None, alive: int) -> MemoryKinds:
    """A census's kinds with the libraries' workspaces a trace saw alive (``alive`` bytes), up to what the
    census left unexplained.  No census sees a workspace (no tensor stands behind it), but a library
    keeps it once made (cuBLAS: one per handle and stream, to the process's end), so the trace's figure
    holds after its window; where less is unexplained, some was freed, and only that much is named."""
    left = unexplained(allocated, kinds)
    if not alive or left is None or left <= 0 or kinds.workspace is not None:
        return kinds
    return msgspec.structs.replace(kinds, workspace=min(alive, left))


def explained(split: MemorySplit) -> int:
    return (split.allocated or 0) - max(split.unexplained or 0, 0)


def better_peak(split: MemorySplit, best: MemorySplit, trace: bool) -> bool:
    assert split.allocated is not None and best.allocated is not None
    if split.allocated > best.allocated * (1 + PEAK_SAME):
        return True
    if split.allocated < best.allocated * (1 - PEAK_SAME):
        return False
    if trace and best.source != "allocator-trace":
        return True
    return split.allocated >= best.allocated and explained(split) >= explained(best)


def only_measured(blocks: MemoryKinds, census: MemoryKinds) -> MemoryKinds:
    """Block kinds, with a kind the census could not measure and no block named left None."""
    values = {}
    for kind in TRACE_KINDS:
        value = getattr(blocks, kind)
        values[kind] = value if value or getattr(census, kind) is not None else None
    return MemoryKinds(**values)


def split_of_moment(
    census: MemoryKinds,
    blocks: BlockSplit | None,
    allocated: int | None,
    phase: str,
    step: int,
    traced: bool,
    census_parts: OtherParts | None = None,
) -> MemorySplit:
    """The split of one moment (an OOM's): the allocator's blocks alive then, each classified (``blocks``,
    where a snapshot was taken), else the census's kinds (``census_parts``: its ``other`` by part).
    ``traced``: the blocks come from a recorded trace."""
    if blocks is None:
        return MemorySplit(
            allocated=allocated, by_kind=census, unexplained=unexplained(allocated, census), phase=phase, step=step,
            other_parts=census_parts,
        )
    kinds = only_measured(blocks.memory_kinds(), census)
    return MemorySplit(
        allocated=allocated,
        by_kind=kinds,
        unexplained=unexplained(allocated, kinds),
        source="allocator-trace" if traced else "tensors",
        phase=phase,
        step=step,
        unexplained_at=blocks.largest("unexplained"),
        script_at=blocks.largest("script"),
        kept_at=blocks.largest("kept"),
        other_at=blocks.largest("other"),
        other_parts=blocks.parts(),
    )
