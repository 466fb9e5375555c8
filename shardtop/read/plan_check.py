"""Predicted against measured, per rank: the plan a run wrote at set-up beside what its ranks held.

The prediction is the run's ``Planned`` event (``shardtop plan``'s figures for
the strategy the run really runs).  The measurement is the read model's:
parameters, gradients and optimizer state from each rank's latest snapshot
taken after the engine held the model, and the allocator's peak from its
memory samples (for a rank that ran out of memory: what it had allocated plus
what it asked for, the least it needed).  CPU processes have no allocator to
ask, so their peak is not measured.

Only what a rank reached is compared: the allocator's peak grows over the
run, so a run stopped in its first forward pass is set against the plan's
peak up to that forward, not against the optimizer step it never met.  The
error is ``(predicted - measured) / measured``: negative when the plan was
low.  Pure Python: no torch, no I/O (``RunModel.plan_check`` is the one
place it is asked).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from shardtop.rundir.engines import MANUAL, ZERO3
from shardtop.rundir.events import TIMELINE, Planned, PlannedRank

if TYPE_CHECKING:
    from shardtop.read.rank_facts import RankFacts

MISS_RATIO = 0.10
"""A measured peak further than this from the plan's is a miss.  The plan met each of five finished
H200 preset recordings within 5 % (``tests/unit/test_plan_recordings.py``): twice that agreement leaves room
for the allocator's rounding and run-to-run noise, and a miss then means a part of memory the plan does
not model (such as the cuDNN workspace of a convolution shape not measured)."""
MISS_MIN_BYTES = 64 * 2**20
"""Nor is a difference below 64 MiB a miss: that is the cuBLAS workspaces' size, which differs by GPU
generation and library version; on a model that small, 10 % is noise of the libraries, not of the model."""


@dataclass(frozen=True)
class Measured:
    """What one rank held, as far as the run recorded it; None where it was not seen."""

    params: int | None
    grads: int | None
    """None where no gradient was seen: a loop that clears them before the snapshot, or ZeRO's own buffer."""
    optimizer: int | None
    peak: int | None
    peak_source: str
    """``allocator peak``, ``allocated + requested at the OOM`` or "" (not measured: a CPU process)."""


@dataclass(frozen=True)
class RankCheck:
    """One rank: the plan's figures, the plan's peak over the phases the rank reached, what it measured."""

    rank: int
    predicted: PlannedRank
    reached: str
    """The last phase of the plan's timeline this rank reached (``set-up`` … ``next backward``)."""
    predicted_peak: int
    """The plan's peak over the phases reached: what the measured peak is set against."""
    measured: Measured
    out_of_memory: bool
    complete: bool
    """The rank met every phase it reached in full (it finished, or went through two steps), so its peak
    can prove the plan high as well as low; otherwise its peak so far is only the least it will need."""
    planned_oom_at: str | None = None
    """Where the plan said every rank runs out of memory (a phase of ``TIMELINE``); None where it fits or
    was not judged."""

    @property
    def oom_as_planned(self) -> bool | None:
        """The rank ran out of memory in the phase the plan said it would; None when it did not run out.

        Like with like: a rank that ran out at set-up did not run out "as planned" by a plan that
        foresaw the first backward pass."""
        if not self.out_of_memory:
            return None
        return self.planned_oom_at is not None and self.reached == self.planned_oom_at

    @property
    def errors(self) -> dict[str, float | None]:
        """Relative error of each figure, ``(predicted - measured) / measured``; None where not measured."""
        p, m = self.predicted, self.measured
        pairs = {"params": (p.params, m.params), "grads": (p.grads, m.grads), "optimizer": (p.optimizer, m.optimizer)}
        return {name: relative_error(planned, seen) for name, (planned, seen) in pairs.items()} | {
            "peak": self.peak_error}

    @property
    def peak_error(self) -> float | None:
        """The peak's error; None where the rank's peak so far cannot judge the plan (not complete, and
        below the plan: a run stopped in set-up, or one that ran out of memory where the plan said it would)."""
        seen = self.measured.peak
        if seen is None or (not self.complete and seen <= self.predicted_peak):
            return None
        return relative_error(self.predicted_peak, seen)

    @property
    def missed(self) -> bool:
        """The measured peak is off the plan by more than ``MISS_RATIO`` and ``MISS_MIN_BYTES``."""
        seen = self.measured.peak
        if seen is None or seen <= 0 or self.peak_error is None:
            return False
        return abs(seen - self.predicted_peak) > max(MISS_RATIO * seen, MISS_MIN_BYTES)


@dataclass(frozen=True)
class PlanCheck:
    plan: Planned
    ranks: tuple[RankCheck, ...]

    @property
    def missed(self) -> tuple[RankCheck, ...]:
        return tuple(r for r in self.ranks if r.missed)

    @property
    def worst(self) -> RankCheck | None:
        """The rank whose measured peak is furthest from the plan's (relative), if any peak was measured."""
        measured = [r for r in self.ranks if r.peak_error is not None]
        return max(measured, key=lambda r: abs(r.peak_error or 0.0), default=None)


def relative_error(predicted: int | None, measured: int | None) -> float | None:
    if predicted is None or measured is None or measured <= 0:
        return None
    return (predicted - measured) / measured


def reached(r: RankFacts) -> int:
    """How many phases of the plan's timeline the rank reached (1: set-up only … 6: a second step)."""
    rs = r.state
    done = rs.last_step.step if rs.last_step is not None else 0
    phase = rs.oom.phase if rs.oom is not None else rs.phase
    if done >= 2:
        return 6
    if done == 1:
        return {"forward": 5, "backward": 6}.get(phase, 4)
    return {"forward": 2, "backward": 3, "optimizer": 4}.get(phase, 1)


def _two_steps(r: RankFacts) -> bool:
    return r.state.last_step is not None and r.state.last_step.step >= 2


def on_device(
    r: RankFacts, values: Sequence[int] | None, manual: bool, offloaded: Sequence[int] | None = None
) -> int | None:
    """A per-row array of a rank's snapshot summed where the plan counts it: on the rank's GPUs (the most
    loaded one for manual placement, which plans its busiest device), less what the engine offloads to host
    memory (``offloaded``, aligned with ``values``); on a CPU process, everywhere, as the plan counts
    what an offload moves there (it stays in the process's memory)."""
    held = r.shards
    if held is None or values is None:
        return None
    gpu = r.device.startswith("cuda")
    off = offloaded if gpu and offloaded is not None else [0] * len(values)
    by_device: dict[int, int] = {}
    for value, moved, d in zip(values, off, held.device, strict=True):
        name = held.devices[d] if 0 <= d < len(held.devices) else ""
        value -= moved
        if value and (name.startswith("cuda") if gpu else name not in ("", "meta")):
            by_device[d] = by_device.get(d, 0) + value
    if manual and gpu:
        return max(by_device.values(), default=0)
    return sum(by_device.values())


def measured(r: RankFacts, engine: str, manual: bool) -> Measured:
    """Parameters from a snapshot taken once the engine held the model (a set-up one is the model as built,
    not as run); gradients and optimizer state only from one taken after a step (before it they do not
    exist yet).  On a GPU rank, what the engine offloads to host memory (parameters on its CPU, the gradients
    and optimizer state it says it offloads) is not the device's, as in the plan."""
    held = r.shards
    params = grads = optimizer = None
    if held is not None:
        params = on_device(r, held.bytes, manual) or 0
        if engine == ZERO3:  # whole copies of the small parameters, held next to the partitions
            whole = held.info.get("gathered_bytes")
            params += whole if isinstance(whole, int) else 0
        if held.stage == "step":
            grads = on_device(r, held.grad_bytes, manual, held.offloaded_grad_bytes) or None
            optimizer = on_device(r, held.optim_bytes, manual, held.offloaded_optim_bytes)
    peak, source = None, ""
    oom = r.oom
    if oom is not None and oom.allocated is not None:
        peak, source = oom.allocated + (oom.requested_bytes or 0), "allocated + requested at the OOM"
    elif r.allocator_peak is not None:
        peak, source = r.allocator_peak, "allocator peak"
    return Measured(params=params, grads=grads, optimizer=optimizer, peak=peak, peak_source=source)


def check_plan(plan: Planned, ranks: Sequence[RankFacts], engine: str) -> PlanCheck:
    manual = plan.engine == MANUAL
    p = plan.per_rank
    checks = []
    for r in ranks:
        n = reached(r)
        timeline = p.timeline[:n] if p.timeline else [p.peak]
        checks.append(
            RankCheck(
                rank=r.rank,
                predicted=p,
                reached=TIMELINE[min(n, len(TIMELINE)) - 1],
                predicted_peak=max(timeline),
                measured=measured(r, engine or plan.engine, manual),
                out_of_memory=r.oom is not None,
                complete=r.status.state == "finished" or _two_steps(r),
                planned_oom_at=plan.runs_out_at if plan.fits is False else None,
            )
        )
    return PlanCheck(plan=plan, ranks=tuple(checks))
