"""``plan-missed``: the run's measured peak is far from the plan it wrote at set-up.

One model of memory plans every model, with nothing fitted per model; when
a run's peak is off the plan by more than ``plan_check.MISS_RATIO`` (and
``MISS_MIN_BYTES``), that model missed something in this run, and the user
should know before trusting the next plan of it.  The finding says by how
much, in which direction, and which part differed most when the run
recorded the parts (parameters, gradients, optimizer state); when those
match, the rest is what the plan models but the probe does not measure
part by part.  The comparison itself is the read model's (``RunModel.plan_check``).
"""

from __future__ import annotations

from dataclasses import dataclass

from shardtop.diagnose.facts import KindsEvidence, fmt
from shardtop.diagnose.finding import Evidence, Explanation, Rule
from shardtop.read.plan_check import MISS_MIN_BYTES, MISS_RATIO, RankCheck, relative_error
from shardtop.read.run_model import RunModel
from shardtop.words import noun


def percent(ratio: float) -> str:
    """``15 %``: the size of a relative error, in the project's way of writing percentages."""
    return f"{abs(ratio) * 100:.0f} %"


PART_WORDS = {"params": "parameters", "grads": "gradients", "optimizer": "optimizer state"}


@dataclass(frozen=True)
class PartDifference:
    part: str
    """params, grads or optimizer."""
    predicted: int
    measured: int


@dataclass(frozen=True)
class PlanMissed(Evidence):
    strategy: str
    made_by: str
    rank: int
    """The rank furthest off the plan."""
    ranks: tuple[int, ...]
    """Every rank off the plan."""
    reached: str
    """The last phase of the plan this rank reached: its peak is set against the plan's up to there."""
    predicted_peak: int
    measured_peak: int
    peak_source: str
    error: float
    """``(predicted - measured) / measured``."""
    threshold: float
    min_bytes: int
    out_of_memory: bool
    plan_fits: bool | None
    usable: int | None
    largest_part: PartDifference | None
    """The part whose bytes differ most, when that is a good share of the peak's difference."""
    parts_compared: tuple[str, ...]
    """The parts measured on that rank, all within ``threshold`` of the plan when ``largest_part`` is None."""
    at_peak: KindsEvidence | None = None
    """What filled that rank's memory at its peak, by kind, where the probe split the peak."""
    planned_activations: int = 0
    planned_gathered: int = 0
    planned_buffers: int = 0
    planned_conv_workspace: int = 0


def _parts(r: RankCheck) -> list[PartDifference]:
    p, m = r.predicted, r.measured
    seen = {"params": (p.params, m.params), "grads": (p.grads, m.grads), "optimizer": (p.optimizer, m.optimizer)}
    return [
        PartDifference(name, planned, measured) for name, (planned, measured) in seen.items() if measured is not None
    ]


def find_plan_missed(m: RunModel) -> PlanMissed | None:
    check = m.plan_check
    if check is None or not check.missed:
        return None
    r = max(check.missed, key=lambda x: abs(x.peak_error or 0.0))
    assert r.measured.peak is not None and r.peak_error is not None
    gap = abs(r.measured.peak - r.predicted_peak)
    parts = _parts(r)
    largest = max(parts, key=lambda d: abs(d.measured - d.predicted), default=None)
    if largest is not None and abs(largest.measured - largest.predicted) < gap / 4:
        largest = None
    off = [d for d in parts if abs(relative_error(d.predicted, d.measured) or 0.0) > MISS_RATIO]
    if largest is None and off:
        largest = max(off, key=lambda d: abs(d.measured - d.predicted))
    return PlanMissed(
        strategy=check.plan.strategy,
        made_by=check.plan.made_by,
        rank=r.rank,
        ranks=tuple(x.rank for x in check.missed),
        reached=r.reached,
        predicted_peak=r.predicted_peak,
        measured_peak=r.measured.peak,
        peak_source=r.measured.peak_source,
        error=r.peak_error,
        threshold=MISS_RATIO,
        min_bytes=MISS_MIN_BYTES,
        out_of_memory=r.out_of_memory,
        plan_fits=check.plan.fits,
        usable=check.plan.usable,
        largest_part=largest,
        parts_compared=tuple(d.part for d in parts),
        at_peak=KindsEvidence.of(facts.memory_peak) if (facts := m.rank(r.rank)) is not None else None,
        planned_activations=r.predicted.activations,
        planned_gathered=r.predicted.gathered,
        planned_buffers=r.predicted.buffers,
        planned_conv_workspace=r.predicted.conv_workspace,
    )


def _part_words(e: PlanMissed) -> str:
    d = e.largest_part
    if d is not None:
        return (
            f"The part that differs most is the {PART_WORDS[d.part]}: planned {fmt(d.predicted)}, "
            f"held {fmt(d.measured)}."
        )
    if e.parts_compared and e.at_peak is not None:
        names = " and ".join(PART_WORDS[p] for p in e.parts_compared)
        return (
            f"The {names} match the plan. At rank {e.rank}'s peak{e.at_peak.when} the probe found "
            f"{e.at_peak.sentence()}; the plan counts {fmt(e.planned_activations)} of activations, "
            f"{fmt(e.planned_gathered)} of gathered parameters, {fmt(e.planned_buffers)} of buffers and "
            f"{fmt(e.planned_conv_workspace)} of cuDNN convolution workspace (for the convolution shapes measured), "
            "and no other temporaries, which the probe counts as other."
        )
    if e.parts_compared:
        names = " and ".join(PART_WORDS[p] for p in e.parts_compared)
        return (
            f"The {names} match the plan, so the difference lies in what the probe does not measure part by "
            "part: activations, gathered parameters, the engine's buffers, the step's temporaries, or a library's "
            "workspace (cuDNN's convolution workspace is planned only for the convolution shapes measured)."
        )
    return (
        "The run recorded no per-part figures (no snapshot after the engine held the model), "
        "so which part differs is not known."
    )


def explain_plan_missed(e: PlanMissed) -> Explanation:
    low = e.measured_peak > e.predicted_peak
    others = [r for r in e.ranks if r != e.rank]
    detail = (
        f"shardtop planned this run ({e.strategy}) to peak at {fmt(e.predicted_peak)} per rank up to "
        f"{'the ' + e.reached if e.reached != 'set-up' else 'set-up'}; rank {e.rank} measured {fmt(e.measured_peak)} "
        f"({e.peak_source}): the plan was {percent(e.error)} {'low' if low else 'high'}, beyond the "
        f"{percent(e.threshold)} (and {fmt(e.min_bytes)}) a plan is held to."
    )
    if others:
        detail += f" Also off: {noun(len(others), 'rank')} {', '.join(map(str, others))}."
    if e.out_of_memory and e.plan_fits:
        detail += f" The plan said it fits ({fmt(e.usable)} usable per rank), yet the rank ran out of memory."
    detail += (
        " The model of memory missed something here: "
        + ("this run holds memory it does not count. " if low else "it counts memory this run never held. ")
        + _part_words(e)
    )
    fix = (
        f"Until the plan accounts for it, budget from what this run measured ({fmt(e.measured_peak)} per rank at "
        "this batch and strategy) rather than from the plan, for this model and ones like it; "
        "`shardtop report RUN --format json` holds both, rank by rank, for a bug report to shardtop."
    )
    return Explanation(
        title=f"The plan was {percent(e.error)} {'low' if low else 'high'}: rank {e.rank} peaked at "
        f"{fmt(e.measured_peak)}, planned {fmt(e.predicted_peak)}",
        detail=detail,
        fix=fix,
        severity="warning",
    )


PLAN_MISSED = Rule("plan-missed", find_plan_missed, explain_plan_missed)
