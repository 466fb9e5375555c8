"""How much of its limit the CUDA caching allocator handed out, rank by rank, in the GPU recordings.

For every rank of every recording under ``tests/fixtures/runs`` whose allocator
was capped (``Memory.limit``, a per-process memory fraction or
``gpu_mem_limit``): the most it had allocated (the allocator's own peak), and,
where it ran out, what it then had allocated plus what it asked for.  For the
ranks without a cap: reserved over allocated at the allocator's peaks.  Read by
``tests/unit/test_fragmentation_allowance.py`` and ``bench/allocator_shares.py``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from shardtop.rundir.event_files import read_all
from shardtop.rundir.events import Exit, Memory, Oom

RUNS = Path(__file__).resolve().parents[1] / "fixtures" / "runs"
FRAGMENTATION_FITTED_ON = "h200-rehearsal/20261201-211814-zero3-linear-fixed-f13b"
"""The recording ``FRAGMENTATION`` (``shardtop/plan/cards.py``) was set from: story 2 fixed at 4000 layers,
rank 0 of two rehearsed on an H200 under a 15 GiB cap, out of memory at 96.7 % of it."""


@dataclass(frozen=True)
class RankAllocator:
    """One rank's allocator over a recorded run."""

    run: str
    """``machine/run-directory``, e.g. ``h200-rehearsal/20261201-211814-zero3-linear-fixed-f13b``."""
    rank: int
    limit: int | None
    """The allocator's cap in bytes; None without one."""
    peak_allocated: int
    peak_reserved: int
    oom: Oom | None
    finished: bool
    """The rank exited with code 0."""

    @property
    def reached(self) -> float:
        """The share of the limit the allocator handed out at its peak."""
        assert self.limit
        return self.peak_allocated / self.limit

    @property
    def failed_at(self) -> float | None:
        """Allocated plus asked for, as a share of the limit, when the rank ran out; None if it did not."""
        if self.oom is None or self.oom.allocated is None or self.oom.requested_bytes is None or not self.limit:
            return None
        return (self.oom.allocated + self.oom.requested_bytes) / self.limit


def gpu_ranks() -> list[RankAllocator]:
    """Every rank of every recording whose allocator reported its peaks (the GPU recordings)."""
    found = []
    for events_dir in sorted(RUNS.glob("*/*/events")):
        events, _ = read_all(events_dir)
        name = f"{events_dir.parent.parent.name}/{events_dir.parent.name}"
        for rank in sorted({e.rank for e in events}):
            mine = [e for e in events if e.rank == rank]
            stats = [e.allocator for e in mine if isinstance(e, Memory | Oom) and e.allocator is not None]
            oom = next((e for e in mine if isinstance(e, Oom)), None)
            limits = [e.limit for e in mine if isinstance(e, Memory | Oom) and e.limit]
            peaks = [s.peak_allocated or 0 for s in stats] + [e.peak or 0 for e in mine if isinstance(e, Memory | Oom)]
            if not stats and (oom is None or oom.allocated is None):
                continue
            found.append(RankAllocator(
                run=name,
                rank=rank,
                limit=max(limits) if limits else None,
                peak_allocated=max([*peaks, oom.allocated or 0] if oom else peaks),
                peak_reserved=max([s.peak_reserved or 0 for s in stats] + ([oom.reserved or 0] if oom else [])),
                oom=oom,
                finished=any(isinstance(e, Exit) and e.code == 0 for e in mine),
            ))
    return found
