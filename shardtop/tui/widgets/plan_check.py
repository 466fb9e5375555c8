"""``PlanVsRun``: the plan the run wrote at set-up, against what each rank measured.

Two short lines per rank, ``plan/run`` for each figure, and the peak's error; a rank
off the plan by more than the plan is held to is marked ``✗ missed`` in
words as well as colour.  The comparison is the read model's
(``RunModel.plan_check``); this only lays it out.
"""

from __future__ import annotations

from rich.text import Text
from textual.containers import VerticalScroll
from textual.widgets import Static

from shardtop.read.plan_check import PlanCheck, RankCheck
from shardtop.tui.format import format_bytes
from shardtop.units import short_bytes


def _pair(planned: int | None, measured: int | None) -> str:
    return f"{short_bytes(planned)}/{short_bytes(measured)}"


def _judged(c: RankCheck) -> str:
    error = c.peak_error
    if error is not None:
        return f"{error * 100:+.0f} %" + (" ✗ missed" if c.missed else "")
    if c.oom_as_planned:
        return "OOM, as planned"
    if c.out_of_memory and c.planned_oom_at is not None:
        return f"OOM at {c.reached}, plan: {c.planned_oom_at}"
    if c.out_of_memory:
        return "OOM"
    return "-"


def verdict_words(check: PlanCheck) -> str:
    plan = check.plan
    if plan.fits is None:
        return "fits: not judged (no GPU or limit)"
    usable = f"{format_bytes(plan.usable)} usable"
    return f"fits {plan.gpu} ({usable})" if plan.fits else f"does not fit {plan.gpu} ({usable})"


def plan_text(check: PlanCheck) -> Text:
    """The plan's strategy and verdict, then per rank two short lines: the peak and its error, the parts.

    Short lines, so that the side panel of an 80-column terminal shows them whole."""
    plan = check.plan
    text = Text()
    text.append("Planned at set-up: ", "bold")
    text.append(f"{plan.strategy}; batch {plan.batch_size}; {verdict_words(check)}\n")
    text.append("plan/run per rank\n", "dim")
    for c in check.ranks:
        text.append(f"r{c.rank:<3}", "bold")
        text.append(f"peak {_pair(c.predicted_peak, c.measured.peak)}  ")
        text.append(_judged(c) + "\n", "bold" if c.missed else "")
        text.append(
            f"    params {_pair(c.predicted.params, c.measured.params)}  "
            f"grads {_pair(c.predicted.grads, c.measured.grads)}  "
            f"optim {_pair(c.predicted.optimizer, c.measured.optimizer)}\n"
        )
    text.append("The peak is the plan's up to the phase each rank reached; error = (plan − run) / run.", "dim")
    if all(c.measured.peak is None for c in check.ranks):
        text.append(" CPU processes have no allocator peak.", "dim")
    for note in plan.notes:
        text.append(f"\nnote: {note}", "dim")
    return text


class PlanVsRun(VerticalScroll):
    """The run's own plan beside its measurements (the run view's Plan tab)."""

    DEFAULT_CSS = """
    PlanVsRun > Static {
        height: auto;
    }
    """

    def __init__(self, id: str | None = None, classes: str | None = None) -> None:
        super().__init__(id=id, classes=classes)
        self._check: PlanCheck | None = None

    def compose(self):  # type: ignore[no-untyped-def]
        yield Static("", id="plan-text")

    def show(self, check: PlanCheck | None) -> None:
        if check is None or check == self._check:
            return
        self._check = check
        self.query_one("#plan-text", Static).update(plan_text(check))
