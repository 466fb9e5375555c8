"""One rehearsal of a set-up at one micro-batch, as fit reads it from the run.  Pure.

A batch fits when every rehearsed rank finished the steps asked of it; it runs out of memory when one
did (a run fit stopped once a rank had run out counts so).  Anything else failed, and says how: the
search does not take another reason for a memory boundary.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from shardtop.fit.search import Outcome, Probe
from shardtop.read.memory_kinds import bytes_by_kind, split_sentence
from shardtop.read.rank_facts import RankFacts, RankStateName
from shardtop.read.run_model import RunModel
from shardtop.rundir.memory_figures import MemorySplit


@dataclass(frozen=True)
class RankMeasure:
    """One rehearsed rank of a trial."""

    rank: int
    state: RankStateName
    detail: str
    peak: int | None
    """The allocator's peak (on CPU, the capped C allocator's); None where nothing was measured."""
    steps: int
    step_seconds: float | None
    """This rank's usual step after the first, collectives not run; None before a second step."""
    fills: MemorySplit | None
    """What filled its memory: at its peak where that was split, at its OOM where it ran out."""
    oom_phase: str | None
    offloaded: int = 0
    """Bytes the engine's offload policy held in host memory for this rank (parameters, gradients, optimizer
    state): beside ``peak``, which counts the device's memory only."""


@dataclass(frozen=True)
class Trial:
    """One set-up at one micro-batch, rehearsed as one run."""

    batch: int
    outcome: Outcome
    ranks: tuple[RankMeasure, ...]
    run_id: str
    run_path: str
    seconds: float
    """Wall time of the rehearsal, start to end."""
    detail: str = ""
    """Why it failed, in words, where it did."""

    @property
    def peak(self) -> int | None:
        peaks = [r.peak for r in self.ranks if r.peak is not None]
        return max(peaks) if peaks else None

    @property
    def largest(self) -> RankMeasure | None:
        """The rank that held most (or the one that ran out)."""
        oom = next((r for r in self.ranks if r.state == "out of memory"), None)
        return oom or max(self.ranks, key=lambda r: r.peak or 0, default=None)

    @property
    def step_seconds(self) -> float | None:
        """The slowest rehearsed rank's usual step."""
        times = [r.step_seconds for r in self.ranks if r.step_seconds is not None]
        return max(times) if times else None

    @property
    def probe(self) -> Probe:
        return Probe(self.batch, self.outcome, self.peak if self.outcome == "fits" else None)


def usual_step(seconds: tuple[float, ...]) -> float | None:
    """The median step after the first (which warms caches up and creates the optimizer's state)."""
    later = seconds[1:]
    return statistics.median(later) if later else None


def _fills(r: RankFacts) -> MemorySplit | None:
    if r.oom is not None and r.oom.memory is not None:
        return r.oom.memory
    return r.memory_peak


def rank_measure(r: RankFacts) -> RankMeasure:
    return RankMeasure(
        rank=r.rank,
        state=r.status.state,
        detail=r.status.detail,
        peak=r.allocator_peak,
        steps=r.state.step,
        step_seconds=usual_step(r.state.step_seconds),
        fills=_fills(r),
        oom_phase=r.oom.phase if r.oom is not None else None,
        offloaded=r.offloaded.total,
    )


def trial_of(model: RunModel, batch: int, *, min_steps: int, seconds: float, run_id: str, path: str) -> Trial:
    """The trial a finished (or stopped) rehearsal's run model tells."""
    ranks = tuple(rank_measure(r) for r in model.ranks)
    if any(r.state == "out of memory" for r in ranks):
        return Trial(batch, "out of memory", ranks, run_id, path, seconds)
    missing = [r for r in model.expected_ranks if r not in {m.rank for m in ranks}]
    if missing:
        return Trial(batch, "failed", ranks, run_id, path, seconds,
                     detail=f"rank {missing[0]} recorded nothing: {model.status_text}")
    unfinished = next((r for r in ranks if r.state != "finished"), None)
    if unfinished is not None:
        words = unfinished.state + (f" ({unfinished.detail})" if unfinished.detail else "")
        return Trial(batch, "failed", ranks, run_id, path, seconds, detail=f"rank {unfinished.rank} {words}")
    short = next((r for r in ranks if r.steps < min_steps), None)
    if short is not None:
        return Trial(batch, "failed", ranks, run_id, path, seconds,
                     detail=f"rank {short.rank} ran {short.steps} optimizer step(s), fewer than the {min_steps} "
                            "that count the optimizer's state")
    return Trial(batch, "fits", ranks, run_id, path, seconds)


def fills_sentence(split: MemorySplit | None) -> str:
    """What filled a rank's memory, in the words the report uses; "" where nothing was split."""
    return split_sentence(split) if split is not None else ""


def fills_dict(split: MemorySplit | None) -> dict[str, int | None] | None:
    return bytes_by_kind(split) if split is not None else None
