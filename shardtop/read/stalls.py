"""Ranks that stall: no phase or step for several of their usual steps, while others have moved on.

A rank waiting in a collective that another rank never entered (a branch only
some ranks take, uneven batches, one rank that left its loop early) stops
moving while its memory sampler goes on writing, so the run looks alive.  A
rank is stalled when it has not entered a phase nor finished a step for
``STALL_STEPS`` of its usual steps (at least ``MIN_STALL_S``) and some other
rank is at a later step or has ended.  A rank busy in one long step is not:
its peers are in that step too (or waiting for it), none ahead.  Alone, a rank
is never called stalled: nothing tells a long step from a hang.  Nor is a rank
that finished the very step at which every peer ahead of it ended: it runs
code after its training loop (a save of the model, an evaluation, its
teardown), which nothing tells from a wait either.

Pure: the read model hands in each rank's state and whether it still runs.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from shardtop.read.run_state import RankState

STALL_STEPS = 3
"""Usual steps without progress before a rank counts as stalled."""
MIN_STALL_S = 2.0
"""...and never less than this (a sampler writes every 0.5 s: shorter gaps are its rhythm)."""


@dataclass(frozen=True, slots=True)
class Peer:
    rank: int
    step: int
    phase: str
    ended: bool


@dataclass(frozen=True, slots=True)
class Stall:
    rank: int
    phase: str
    step: int
    idle_s: float
    """Seconds since the rank last entered a phase or finished a step."""
    usual_step_s: float
    """The median of its recent steps."""
    peers: tuple[Peer, ...]
    """The ranks ahead of it or ended, which show it is not one long step of everyone."""
    between_steps: bool = False
    """It finished the last step it entered and began no other: it runs code of its own between steps (a save
    of the model, an evaluation) or waits in a collective outside the steps, which nothing here tells apart."""

    @property
    def words(self) -> str:
        if self.between_steps:
            return f"no step begun for {self.idle_s:.0f} s since it finished step {self.step}"
        return f"no progress for {self.idle_s:.0f} s in {self.phase or 'its phase'} of step {self.step}"


def _median(values: Iterable[float]) -> float | None:
    ordered = sorted(values)
    return ordered[len(ordered) // 2] if ordered else None


def find_stalls(ranks: Iterable[RankState], running: Mapping[int, bool], now: float | None) -> dict[int, Stall]:
    """Each rank that is stalled at ``now`` (the latest event of the run); ``running``: whether each rank
    still runs."""
    states = list(ranks)
    if now is None or len(states) < 2:
        return {}
    stalls: dict[int, Stall] = {}
    for r in states:
        usual = _median(r.step_seconds)
        if not running.get(r.rank) or r.progress_t is None or usual is None:
            continue
        idle = now - r.progress_t
        if idle <= max(STALL_STEPS * usual, MIN_STALL_S):
            continue
        peers = tuple(
            Peer(o.rank, o.step, o.phase, not running.get(o.rank, False))
            for o in states
            if o.rank != r.rank and (o.step > r.step or not running.get(o.rank, False))
        )
        finished = r.last_step is not None and r.last_step.step >= r.step
        if peers and not (finished and all(p.ended and p.step == r.step for p in peers)):
            stalls[r.rank] = Stall(r.rank, r.phase, r.step, idle, usual, peers, between_steps=finished)
    return stalls
