"""The search for a set-up's largest micro-batch: from the plan's batch to the boundary.  Pure.

Each rehearsal says whether a batch fits (every rehearsed rank ran its steps) or runs out of memory,
and how much the largest rank held at its peak.  The search keeps the largest batch that fits and the
smallest that does not, and ends when they are next to each other: the boundary, proven by two runs.

The next batch is where a line through what was measured meets the limit: from the largest batch that
fit and its peak, growing by the bytes one more sample costs, measured between two batches that fit,
or the plan's figure until there are two.  The plan's figure is trusted once from each new batch that
fits; without a line to follow the search halves the bracket (or doubles, with nothing yet out of
memory).  No run starts from one sample and doubles: the first batch is the plan's.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Literal

Outcome = Literal["fits", "out of memory", "failed"]
MAX_BATCH = 1 << 16
"""The largest micro-batch searched: beyond it the answer is "at least this many"."""
MAX_GROWTH = 4
"""Above a batch that fits, the next batch is at most this many times larger."""


@dataclass(frozen=True)
class Probe:
    """What one rehearsal told the search."""

    batch: int
    outcome: Outcome
    peak: int | None
    """The largest rehearsed rank's peak, where it was measured (it fit)."""


@dataclass(frozen=True)
class BoundarySearch:
    """The probes so far, and where to look next."""

    start: int
    """The plan's batch: the first one rehearsed."""
    limit: int
    """What a rank may hold: the batch whose peak passes it does not fit."""
    plan_slope: float | None
    """The plan's bytes per added sample; None where the plan had none."""
    ceiling: int = MAX_BATCH
    probes: tuple[Probe, ...] = ()

    def after(self, probe: Probe) -> BoundarySearch:
        return replace(self, probes=(*self.probes, probe))

    @property
    def fitting(self) -> Probe | None:
        """The largest batch that fit."""
        return max((p for p in self.probes if p.outcome == "fits"), key=lambda p: p.batch, default=None)

    @property
    def too_large(self) -> int | None:
        """The smallest batch that ran out of memory."""
        return min((p.batch for p in self.probes if p.outcome == "out of memory"), default=None)

    @property
    def failed(self) -> Probe | None:
        """A rehearsal that failed for another reason than memory: the search stops there."""
        return next((p for p in self.probes if p.outcome == "failed"), None)

    @property
    def done(self) -> bool:
        return self.next_batch() is None

    @property
    def found(self) -> bool:
        """The boundary is proven: a batch that fits beside one that does not (or 1 that does not, or the
        ceiling that fits)."""
        lo, hi = self.fitting, self.too_large
        if lo is not None and (lo.batch >= self.ceiling or (hi is not None and hi == lo.batch + 1)):
            return True
        return lo is None and hi == 1

    def slope(self) -> float | None:
        """Bytes per added sample: measured between the smallest and largest batches that fit, once there
        are two with peaks; else the plan's."""
        measured = sorted((p for p in self.probes if p.outcome == "fits" and p.peak is not None),
                          key=lambda p: p.batch)
        if len(measured) >= 2 and measured[-1].batch > measured[0].batch:
            rise = (measured[-1].peak or 0) - (measured[0].peak or 0)
            if rise > 0:
                return rise / (measured[-1].batch - measured[0].batch)
        return self.plan_slope if self.plan_slope and self.plan_slope > 0 else None

    def estimate(self) -> int | None:
        """The largest batch the line through the largest fitting batch says fits; None without a line."""
        lo, slope = self.fitting, self.slope()
        if lo is None or lo.peak is None or slope is None:
            return None
        return lo.batch + int((self.limit - lo.peak) // slope)

    def _trusted(self) -> bool:
        """Whether to follow the line now: it is measured (two batches that fit), or it is the plan's and
        the last batch rehearsed is a new one that fits (the plan's figure is trusted once from each)."""
        lo = self.fitting
        if lo is None:
            return False
        measured = sum(1 for p in self.probes if p.outcome == "fits" and p.peak is not None) >= 2
        return measured or self.probes[-1] is lo

    def line(self) -> int | None:
        """The estimate, where the search follows it now; None: it doubles or halves instead."""
        return self.estimate() if self._trusted() else None

    def next_batch(self) -> int | None:
        """The batch to rehearse next; None once the boundary is found, or a rehearsal failed."""
        if self.failed is not None or self.found:
            return None
        if not self.probes:
            return min(max(1, self.start), self.ceiling)
        lo, hi = self.fitting, self.too_large
        line = self.line()
        if lo is None:
            assert hi is not None
            return max(1, hi // 2)
        if hi is None:
            if line is None:
                return min(self.ceiling, lo.batch * 2)
            return min(self.ceiling, lo.batch * MAX_GROWTH, max(lo.batch + 1, line))
        if line is None:
            return (lo.batch + hi) // 2
        return min(hi - 1, max(lo.batch + 1, line))
