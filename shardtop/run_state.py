"""Fold a run's events into one immutable snapshot: the ground the read model stands on.

Pure Python: no torch, no textual.  ``RunStateBuilder.apply`` takes events in
any interleaving of the ranks' files (each rank's own events in order) and
``snapshot()`` hands out a frozen ``RunState``.  What it cannot trust it does
not apply: a tree whose parents point outside it or after the row, or shards
whose arrays disagree in length, are counted as ``inconsistent`` and left out,
so one bad event never breaks a view (the read model, ``run_model.py``,
answers the questions the views ask).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType

from shardtop.events import (
    AnyEvent,
    Exit,
    Fault,
    GpuMemory,
    Hello,
    Memory,
    Oom,
    Phase,
    Planned,
    Shards,
    Step,
    Tree,
    tree_paths,
)

MEMORY_HISTORY = 120
"""Samples of allocator memory kept per rank for sparklines."""

TRAINING_PHASES = frozenset({"forward", "backward", "optimizer"})
"""Phases in which every rank runs the same code: samples taken in them can be compared rank to rank."""

PHASE_SAMPLES_KEPT = 12
"""(step, phase) keys kept per rank for rank-to-rank comparisons; older keys fall out."""

GPU_SAMPLES_KEPT = 12
"""NVML samples taken during training kept per host."""


@dataclass(frozen=True)
class PhaseSample:
    """A rank's latest memory sample taken in one step and phase."""

    step: int
    phase: str
    memory: Memory


@dataclass(frozen=True)
class GpuSample:
    """One NVML reading of a host's GPUs, with when and in which phase the sampling rank took it."""

    t: float
    rank: int
    step: int
    phase: str
    gpus: tuple[GpuMemory, ...]


@dataclass(frozen=True)
class RankState:
    """What one rank has said so far."""

    rank: int
    host: str = ""
    hello: Hello | None = None
    phase: str = ""
    step: int = 0
    last_step: Step | None = None
    memory: Memory | None = None
    peak_memory: Memory | None = None
    """The sample with the highest allocator peak (or allocation) so far."""
    allocated_history: tuple[int, ...] = ()
    peak_host_rss: int = 0
    """The highest resident host memory of the rank's process in any sample."""
    phase_samples: tuple[PhaseSample, ...] = ()
    """The latest sample of each recent (step, phase) in a training phase, oldest first."""
    shards: Shards | None = None
    """The latest shards for the current tree."""
    setup_shards: Shards | None = None
    """How the rank held the model before the engine wrapped it (stage ``setup``)."""
    oom: Oom | None = None
    exit: Exit | None = None
    faults: tuple[Fault, ...] = ()
    """Parts of the probe that failed on this rank and were switched off (training went on)."""

    @property
    def device(self) -> str:
        if self.hello is not None:
            return self.hello.device
        return self.memory.device if self.memory else ""

    @property
    def pid(self) -> int | None:
        return self.hello.pid if self.hello else None

    @property
    def left_at(self) -> float | None:
        """When the rank stopped running its training: exit, OOM or teardown, whichever came first."""
        times = [e.t for e in (self.exit, self.oom) if e is not None]
        return min(times) if times else None


@dataclass(frozen=True)
class RunState:
    """Everything a run's events said, at one moment."""

    tree: Tree | None = None
    paths: tuple[str, ...] = ()
    ranks: Mapping[int, RankState] = field(default_factory=lambda: MappingProxyType({}))
    gpus: Mapping[str, tuple[GpuMemory, ...]] = field(default_factory=lambda: MappingProxyType({}))
    """The latest NVML sample of each host's GPUs."""
    gpu_samples: Mapping[str, tuple[GpuSample, ...]] = field(default_factory=lambda: MappingProxyType({}))
    """Recent NVML samples of each host taken during training (see ``TRAINING_PHASES``)."""
    skipped_by: Mapping[str, int] = field(default_factory=lambda: MappingProxyType({}))
    """Lines of the event files that could not be read, by reason: bad, unknown, newer, torn."""
    inconsistent: int = 0
    """Events that were well-formed but contradicted themselves or the tree, and were left out."""
    plan: Planned | None = None
    """The plan of the strategy the run runs, as the rank that made it at set-up wrote it (the latest)."""
    events: int = 0
    first_t: float | None = None
    last_t: float | None = None

    @property
    def skipped(self) -> int:
        return sum(self.skipped_by.values())

    def rank_list(self) -> list[RankState]:
        """The ranks in rank order."""
        return [self.ranks[r] for r in sorted(self.ranks)]


def tree_problem(tree: Tree) -> str:
    """Why a tree cannot be drawn (columns of different lengths, parents outside it), or ``""``."""
    n = len(tree.names)
    if n == 0:
        return "it has no rows"
    if any(len(col) != n for col in (tree.parents, tree.types, tree.params, tree.bytes)):
        return "its columns differ in length"
    if tree.parents[0] != -1:
        return "its first row is not the root"
    if any(not 0 <= p < row for row, p in enumerate(tree.parents) if row):
        return "a parent row points outside the tree or after its child"
    if any(not 0 <= t < len(tree.type_names) for t in tree.types):
        return "a type index points outside type_names"
    if any(v < 0 for v in tree.params) or any(v < 0 for v in tree.bytes):
        return "a size is negative"
    return ""


def shards_problem(shards: Shards) -> str:
    """Why a rank's shards cannot be read (arrays of different lengths, indexes out of range), or ``""``."""
    n = len(shards.bytes)
    columns = [shards.device, shards.state, shards.unit]
    columns += [c for c in (shards.grad_bytes, shards.optim_bytes) if c is not None]
    if any(len(col) != n for col in columns):
        return "its arrays differ in length"
    if any(not -1 <= d < len(shards.devices) for d in shards.device):
        return "a device index is out of range"
    if any(not -1 <= s < len(shards.states) for s in shards.state):
        return "a state index is out of range"
    if any(not -1 <= u < len(shards.units) for u in shards.unit):
        return "a unit index is out of range"
    if any(not 0 <= u.module < n for u in shards.units):
        return "a unit is rooted outside the tree"
    return ""


def _fits(shards: Shards, tree: Tree | None) -> bool:
    """Shards of the tree in hand must have one entry per row; shards of another tree wait for theirs."""
    return tree is None or shards.tree_id != tree.tree_id or len(shards.bytes) == len(tree.names)


def _peak_of(m: Memory) -> int:
    return max(v for v in (m.peak, m.allocated, 0) if v is not None)


class RunStateBuilder:
    """Applies events in order and hands out immutable ``RunState`` snapshots."""

    def __init__(self) -> None:
        self._state = RunState()
        self._ranks: dict[int, RankState] = {}
        self._gpus: dict[str, tuple[GpuMemory, ...]] = {}
        self._gpu_samples: dict[str, tuple[GpuSample, ...]] = {}
        self._dirty = False

    def apply(self, events: Iterable[AnyEvent]) -> None:
        for event in events:
            self._apply_one(event)

    def note_skipped(self, skipped: Mapping[str, int]) -> None:
        """The reader's skip counts so far (``EventReader.skipped``)."""
        if dict(skipped) != dict(self._state.skipped_by):
            self._state = replace(self._state, skipped_by=MappingProxyType({k: v for k, v in skipped.items() if v}))

    def snapshot(self) -> RunState:
        if self._dirty:
            self._state = replace(
                self._state,
                ranks=MappingProxyType(dict(self._ranks)),
                gpus=MappingProxyType(dict(self._gpus)),
                gpu_samples=MappingProxyType(dict(self._gpu_samples)),
            )
            self._dirty = False
        return self._state

    def _rank(self, event: AnyEvent) -> RankState:
        return self._ranks.get(event.rank) or RankState(rank=event.rank, host=event.host)

    def _reject(self) -> None:
        self._state = replace(self._state, inconsistent=self._state.inconsistent + 1)

    def _apply_one(self, event: AnyEvent) -> None:
        s = self._state
        self._state = replace(
            s,
            events=s.events + 1,
            first_t=event.t if s.first_t is None else min(s.first_t, event.t),
            last_t=event.t if s.last_t is None else max(s.last_t, event.t),
        )
        if isinstance(event, Tree):
            self._apply_tree(event)
            return
        if isinstance(event, Planned):
            self._state = replace(self._state, plan=event)
            return
        if isinstance(event, Shards) and (shards_problem(event) or not _fits(event, self._state.tree)):
            self._reject()
            return
        rs = self._rank(event)
        if isinstance(event, Hello):
            rs = replace(rs, hello=event, host=event.host)
        elif isinstance(event, Shards):
            tree = self._state.tree
            if event.stage == "setup":
                rs = replace(rs, setup_shards=event)
            if tree is None or event.tree_id == tree.tree_id:
                rs = replace(rs, shards=event)
        elif isinstance(event, Memory):
            rs = self._apply_memory(rs, event)
        elif isinstance(event, Phase):
            rs = replace(rs, phase=event.phase, step=max(rs.step, event.step))
        elif isinstance(event, Step):
            rs = replace(rs, last_step=event, step=max(rs.step, event.step))
        elif isinstance(event, Oom):
            if rs.oom is None:  # a rank runs out once; a second record (a retry) keeps the first
                rs = replace(rs, oom=event, phase=event.phase)
            if event.gpus is not None:
                self._gpus[event.host] = tuple(event.gpus)
        elif isinstance(event, Exit):
            rs = replace(rs, exit=event)
        elif isinstance(event, Fault):
            rs = replace(rs, faults=rs.faults + (event,))
        self._ranks[event.rank] = rs
        self._dirty = True

    def _apply_tree(self, tree: Tree) -> None:
        if tree_problem(tree):
            self._reject()
            return
        if self._state.tree is None or tree.tree_id >= self._state.tree.tree_id:
            self._state = replace(self._state, tree=tree, paths=tuple(tree_paths(tree.names, tree.parents)))
            for rank, rs in self._ranks.items():
                if rs.shards is not None and (rs.shards.tree_id != tree.tree_id or not _fits(rs.shards, tree)):
                    self._ranks[rank] = replace(rs, shards=None)
        self._dirty = True

    def _apply_memory(self, rs: RankState, m: Memory) -> RankState:
        history = (rs.allocated_history + (m.allocated or m.host_rss,))[-MEMORY_HISTORY:]
        peak = rs.peak_memory
        if peak is None or _peak_of(m) >= _peak_of(peak):
            peak = m
        samples = rs.phase_samples
        if rs.phase in TRAINING_PHASES and rs.exit is None and rs.oom is None:
            kept = tuple(p for p in samples if (p.step, p.phase) != (rs.step, rs.phase))
            samples = (kept + (PhaseSample(rs.step, rs.phase, m),))[-PHASE_SAMPLES_KEPT:]
        if m.gpus is not None:
            gpus = tuple(m.gpus)
            self._gpus[m.host] = gpus
            if rs.phase in TRAINING_PHASES:
                sample = GpuSample(m.t, m.rank, rs.step, rs.phase, gpus)
                self._gpu_samples[m.host] = (self._gpu_samples.get(m.host, ()) + (sample,))[-GPU_SAMPLES_KEPT:]
        return replace(
            rs,
            memory=m,
            peak_memory=peak,
            allocated_history=history,
            peak_host_rss=max(rs.peak_host_rss, m.host_rss),
            phase_samples=samples,
        )


def fold(events: Iterable[AnyEvent], skipped: Mapping[str, int] | None = None) -> RunState:
    """A snapshot of a whole event list at once (``skipped``: the reader's skip counts)."""
    builder = RunStateBuilder()
    builder.apply(events)
    builder.note_skipped(skipped or {})
    return builder.snapshot()
