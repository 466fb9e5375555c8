"""The probe itself: a part of it failed on some rank and was switched off, so what it shows is partial."""

from __future__ import annotations

from dataclasses import dataclass

from shardtop.diagnose.finding import Evidence, Explanation, Rule
from shardtop.read.run_model import RunModel
from shardtop.rundir.events import FAULT_PARTS


@dataclass(frozen=True)
class PartLost:
    rank: int
    part: str
    error: str


@dataclass(frozen=True)
class ProbeFaults(Evidence):
    faults: tuple[PartLost, ...]


def find_probe_faults(m: RunModel) -> ProbeFaults | None:
    faults = tuple(PartLost(f.rank, f.part, f.error[:300]) for f in m.faults)
    return ProbeFaults(faults) if faults else None


def explain_probe_faults(e: ProbeFaults) -> Explanation:
    said = [
        f"the {FAULT_PARTS.get(f.part, f.part)} on rank {f.rank} ({f.error})" for f in e.faults[:4]
    ] + ([f"{len(e.faults) - 4} more"] if len(e.faults) > 4 else [])
    parts = sorted({FAULT_PARTS.get(f.part, f.part) for f in e.faults})
    return Explanation(
        title=f"shardtop's probe switched off part of its work: {', '.join(parts)}",
        detail=(
            "These parts of the probe failed and were turned off, while training went on: "
            + "; ".join(said)
            + ". What this run shows may miss what they would have recorded."
        ),
        fix="Nothing to change in the training. If the error is not a full disk or a memory cap, report it "
        "as a shardtop bug with `shardtop report RUN --format json` attached.",
        severity="info",
    )


PROBE_FAULTS = Rule("probe-fault", find_probe_faults, explain_probe_faults)
