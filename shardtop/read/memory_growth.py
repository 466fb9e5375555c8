"""Memory that grows from step to step: the rate, the steps it was seen over, and when it runs out.

A rank's memory read at the same phase of successive steps (the start of each
forward, when last step's activations are gone and this step's not yet made)
should stay flat once training has settled.  Tensors kept across steps (a list
of logits, a hook that appends activations) make it climb by about the same
amount every step, until the rank runs out.  What is not growth:

- warm-up: optimizer state made at the first step, buckets and caches filled
  in the first steps (the first ``WARMUP_STEPS`` are left out);
- a plateau: memory that rose and then stopped (the last third of the steps
  must still climb at half the overall rate or more);
- noise: a rise smaller than ``MIN_RISE`` over the whole series, or one that
  does not climb in most of its steps.

Pure: no I/O, no torch.  The read model hands it each rank's series.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

WARMUP_STEPS = 2
"""Steps left out at the start: the optimizer's state and the engines' buffers are made there."""
MIN_POINTS = 6
"""Steps after warm-up needed before a rise can be told from noise."""
MIN_RISE = 8 * 2**20
"""Bytes the fitted line must rise over the series (8 MiB): below it, allocator rounding and noise."""
RISING_SHARE = 0.7
"""Share of step-to-step changes that must be rises."""
LATE_SHARE = 0.5
"""The last third's slope, as a share of the whole series' slope, below which growth has stopped."""


@dataclass(frozen=True, slots=True)
class StepMemory:
    """A rank's memory at the same phase of one step."""

    step: int
    bytes: int
    t: float
    """When it was read (seconds since the epoch)."""


@dataclass(frozen=True, slots=True)
class Growth:
    """A steady rise of one rank's memory from step to step, and where it leads."""

    rate: float
    """Bytes per step, fitted over the steps seen."""
    first_step: int
    last_step: int
    first_bytes: int
    last_bytes: int
    """Memory read at the first and last of the steps fitted."""
    seconds_per_step: float | None
    limit: int | None
    """What the rank may use (a cap, else the device), where known."""

    @property
    def steps_seen(self) -> int:
        return self.last_step - self.first_step + 1

    @property
    def steps_left(self) -> int | None:
        """Steps after the last one seen until the rank reaches its limit; None without a limit."""
        if self.limit is None or self.rate <= 0:
            return None
        return max(0, int((self.limit - self.last_bytes) // self.rate))

    @property
    def out_of_memory_step(self) -> int | None:
        """The step at which the rank is expected to reach its limit."""
        left = self.steps_left
        return None if left is None else self.last_step + left + 1

    @property
    def seconds_left(self) -> float | None:
        left = self.steps_left
        if left is None or self.seconds_per_step is None:
            return None
        return left * self.seconds_per_step


def _slope(points: Sequence[StepMemory]) -> float:
    """Least-squares bytes per step."""
    n = len(points)
    mean_x = sum(p.step for p in points) / n
    mean_y = sum(p.bytes for p in points) / n
    var = sum((p.step - mean_x) ** 2 for p in points)
    if var == 0:
        return 0.0
    return sum((p.step - mean_x) * (p.bytes - mean_y) for p in points) / var


def growth(series: Sequence[StepMemory], limit: int | None = None) -> Growth | None:
    """The steady rise in ``series`` (one reading per step, in step order), or None where there is none."""
    points = [p for p in series if p.step > WARMUP_STEPS]
    if len(points) < MIN_POINTS:
        return None
    rate = _slope(points)
    if rate <= 0 or rate * (points[-1].step - points[0].step) < MIN_RISE:
        return None
    changes = [b.bytes - a.bytes for a, b in zip(points, points[1:], strict=False)]
    if sum(1 for c in changes if c > 0) < RISING_SHARE * len(changes):
        return None
    late = points[-max(3, len(points) // 3):]
    if _slope(late) < LATE_SHARE * rate:
        return None
    spans = [(b.t - a.t) / (b.step - a.step) for a, b in zip(points, points[1:], strict=False) if b.step > a.step]
    seconds = sorted(spans)[len(spans) // 2] if spans else None
    return Growth(
        rate=rate,
        first_step=points[0].step,
        last_step=points[-1].step,
        first_bytes=points[0].bytes,
        last_bytes=points[-1].bytes,
        seconds_per_step=seconds,
        limit=limit,
    )
