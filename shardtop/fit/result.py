"""What fit found: each set-up's plan and rehearsals, and the pick.  Pure.

The pick is the set-up with the largest micro-batch measured, then the least offloaded (offload slows
every step), then without activation checkpointing (it recomputes the forward), then the one as given.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from shardtop.fit.configuration import Configuration, Knob
from shardtop.fit.measure import Trial
from shardtop.fit.predict import PlannedOnly, Prediction

Ending = Literal["found", "budget", "failed", "ruled out", "not reached", "nothing fits"]
"""How a set-up's search ended: the boundary found; the budget spent first; a rehearsal failed for another
reason than memory; the plan ruled it out by far; the budget was spent before it was reached; not even one
sample fits."""


@dataclass(frozen=True)
class SetupResult:
    """One set-up: its plan, its rehearsals, how its search ended."""

    prediction: Prediction
    trials: tuple[Trial, ...]
    ending: Ending
    note: str = ""
    """Why it ended so, in words, where that is not the boundary found."""

    @property
    def configuration(self) -> Configuration:
        return self.prediction.configuration

    @property
    def largest(self) -> Trial | None:
        """The rehearsal at the largest micro-batch that fit."""
        return max((t for t in self.trials if t.outcome == "fits"), key=lambda t: t.batch, default=None)

    @property
    def too_large(self) -> Trial | None:
        """The rehearsal at the smallest micro-batch that ran out of memory."""
        return min((t for t in self.trials if t.outcome == "out of memory"), key=lambda t: t.batch, default=None)

    @property
    def fills(self) -> Trial | None:
        """The rehearsal whose split says what fills the memory at the boundary: the largest batch's where its
        peak was split, else the next batch's out-of-memory record."""
        fit = self.largest
        if fit is not None and fit.largest is not None and fit.largest.fills is not None:
            return fit
        over = self.too_large
        return over if over is not None and over.largest is not None and over.largest.fills is not None else None


@dataclass(frozen=True)
class Use:
    """How to run the pick."""

    line: str
    """The command, as one line to paste."""
    changes: tuple[str, ...]
    """The overrides, flags or config lines that differ from what was given."""


@dataclass(frozen=True)
class FitResult:
    """Everything ``shardtop fit`` prints."""

    title: str
    """The preset, or the user's command."""
    devices: int
    gpu: str
    """The job's GPU in words (``16 GiB``, ``H100-80GB``)."""
    limit: int
    """What a rank may hold: the cap the rehearsals ran under, or the card's share."""
    on: str
    """What the rehearsals ran on: ``CPU``, ``1 × NVIDIA H100 80GB HBM3``."""
    knobs: tuple[Knob, ...]
    setups: tuple[SetupResult, ...]
    seconds: float
    budget_s: float
    use: Use | None = None
    planned_only: tuple[PlannedOnly, ...] = ()
    """Strategies the plan gives a larger micro-batch that the stack has no knob for: never rehearsed."""

    @property
    def rehearsals(self) -> int:
        return sum(len(s.trials) for s in self.setups)

    @property
    def budget_spent(self) -> bool:
        return any(s.ending in ("budget", "not reached") for s in self.setups)

    @property
    def pick(self) -> SetupResult | None:
        fitting = [s for s in self.setups if s.largest is not None]
        return max(fitting, key=pick_key, default=None)


def pick_key(s: SetupResult) -> tuple[int, int, bool, bool]:
    """Largest batch, then least offload, then no recomputation, then as given."""
    trial, conf = s.largest, s.configuration
    assert trial is not None
    return trial.batch, -conf.offload_level, conf.checkpointing is not True, conf.as_given
