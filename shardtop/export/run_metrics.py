"""A run's live figures as Prometheus samples: the run, each rank's memory, step, phase and state, and the
findings by severity.

Every figure is the read model's (the same the TUI and ``shardtop report --format json`` show), so a
dashboard and the report never disagree.  Series of a rank carry ``run``, ``rank``, ``local_rank``,
``world_size`` and ``hostname`` (the rank's host, as nvitop-exporter names it), so they join with the GPU
series of the same host and, through ``shardtop_rank_info``'s ``pid``, with a GPU's processes.  Bytes are
bytes; a figure not recorded (allocator figures on CPU, a kind no source measured) has no series.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import get_args

from shardtop.diagnose import Finding
from shardtop.diagnose.finding import SEVERITIES
from shardtop.export.exposition import Gauge, Labels, Sample, counts, labels, sample, states
from shardtop.read.memory_kinds import bytes_by_kind
from shardtop.read.rank_facts import RankFacts, RankStateName
from shardtop.read.run_model import RunModel
from shardtop.rundir.events import PhaseName
from shardtop.rundir.memory_figures import MemorySplit
from shardtop.rundir.run_status import RunState

RUN_INFO = Gauge("shardtop_run_info", "A run shardtop follows: its program, preset, engine and strategy (always 1).")
RUN_STATE = Gauge("shardtop_run_state", "How the run stands: 1 for its state, 0 for the others.")
RUN_FINDINGS = Gauge("shardtop_run_findings", "Findings of shardtop's diagnosis of the run, by severity.")
RUN_FINDING = Gauge("shardtop_run_finding", "One finding of the run's diagnosis, by its code (always 1).")

RANK_INFO = Gauge("shardtop_rank_info", "A rank of the run: its device, process id and engine (always 1).")
RANK_STATE = Gauge("shardtop_rank_state", "How the rank stands: 1 for its state, 0 for the others.")
RANK_PHASE = Gauge("shardtop_rank_phase", "The phase the rank is in: 1 for it, 0 for the others.")
RANK_STEP = Gauge("shardtop_rank_step", "The latest training step the rank reached.")
RANK_STEP_SECONDS = Gauge("shardtop_rank_last_step_seconds", "How long the rank's latest step took, in seconds.")
RANK_MEMORY = Gauge(
    "shardtop_rank_memory_bytes",
    "What fills the rank's memory now, by kind (at its OOM, if it ran out); unexplained: allocated bytes no "
    "source accounts for.",
)
RANK_MEMORY_PEAK = Gauge("shardtop_rank_memory_peak_bytes", "What filled the rank's memory at its peak, by kind.")
RANK_ALLOCATED = Gauge("shardtop_rank_allocated_bytes", "Bytes the rank's CUDA caching allocator has allocated.")
RANK_RESERVED = Gauge("shardtop_rank_reserved_bytes", "Bytes the rank's CUDA caching allocator has reserved.")
RANK_ALLOCATOR_PEAK = Gauge("shardtop_rank_allocator_peak_bytes", "The highest allocated bytes of the rank so far.")
RANK_LIMIT = Gauge(
    "shardtop_rank_memory_limit_bytes",
    "What the rank may use before it runs out: its cap, else its GPU's memory, else (CPU) its host's.",
)
RANK_HOST_RSS = Gauge("shardtop_rank_host_rss_bytes", "The rank process's resident host memory.")
RANK_HOST_RSS_PEAK = Gauge("shardtop_rank_host_rss_peak_bytes", "The highest resident host memory of the rank.")

RUN_STATES: tuple[str, ...] = get_args(RunState)
RANK_STATES: tuple[str, ...] = get_args(RankStateName)
PHASES: tuple[str, ...] = get_args(PhaseName)


def _split_samples(gauge: Gauge, split: MemorySplit | None, base: Labels) -> list[Sample | None]:
    if split is None:
        return []
    by_kind: dict[str, int | None] = {**bytes_by_kind(split), "unexplained": split.unexplained}
    return [sample(gauge, value, base, kind=kind) for kind, value in by_kind.items()]


def rank_labels(run_id: str, model: RunModel, r: RankFacts) -> Labels:
    hello = r.hello
    return labels(run=run_id, rank=r.rank, local_rank=hello.local_rank if hello is not None else None,
                  world_size=model.world_size, hostname=r.host)


def rank_samples(run_id: str, model: RunModel, r: RankFacts) -> list[Sample | None]:
    """One rank's series."""
    base = rank_labels(run_id, model, r)
    mem, state = r.memory, r.state
    held = r.holdings
    return [
        sample(RANK_INFO, 1, base, device=r.device, pid=r.pid, engine=held.engine if held is not None else None),
        *states(RANK_STATE, RANK_STATES, r.status.state, base, "state"),
        *states(RANK_PHASE, PHASES, state.phase, base, "phase"),
        sample(RANK_STEP, state.step, base),
        sample(RANK_STEP_SECONDS, state.last_step.seconds if state.last_step is not None else None, base),
        *_split_samples(RANK_MEMORY, r.memory_now, base),
        *_split_samples(RANK_MEMORY_PEAK, r.memory_peak, base),
        sample(RANK_ALLOCATED, mem.allocated if mem is not None else None, base),
        sample(RANK_RESERVED, mem.reserved if mem is not None else None, base),
        sample(RANK_ALLOCATOR_PEAK, r.allocator_peak, base),
        sample(RANK_LIMIT, model.memory_limit_of(r), base),
        sample(RANK_HOST_RSS, mem.host_rss if mem is not None and mem.host_rss else None, base),
        sample(RANK_HOST_RSS_PEAK, state.peak_host_rss or None, base),
    ]


def run_samples(run_id: str, model: RunModel, findings: Sequence[Finding]) -> list[Sample | None]:
    """A run's series: the run's own, then each rank's."""
    base = labels(run=run_id)
    by_severity: dict[str, int] = {}
    for f in findings:
        by_severity[f.severity] = by_severity.get(f.severity, 0) + 1
    meta = model.meta
    out: list[Sample | None] = [
        sample(RUN_INFO, 1, base, program=model.program, preset=meta.preset, engine=model.engine,
               strategy=model.strategy, world_size=model.world_size),
    ]
    if model.status is not None:
        out += states(RUN_STATE, RUN_STATES, model.status.state, base, "state")
    out += counts(RUN_FINDINGS, SEVERITIES, by_severity, base, "severity")
    out += [sample(RUN_FINDING, 1, base, code=f.code, severity=f.severity) for f in findings]
    for r in model.ranks:
        out += rank_samples(run_id, model, r)
    return out
