"""Fold a run's events into one immutable snapshot: the ground the read model stands on.

Pure Python: no torch, no textual.  ``RunStateBuilder.apply`` takes events in
any interleaving of the ranks' files (each rank's own events in order) and
``snapshot()`` hands out a frozen ``RunState``.  What it cannot trust it does
not apply: a tree whose parents point outside it or after the row, or shards
whose arrays disagree in length, are counted as ``inconsistent`` and left out,
so one bad event never breaks a view (the read model, ``run_model.py``,
answers the questions the views ask).

A run of 512 ranks appends some 2 000 events a second, so the fold does per
event only what that event changes, in place (``_RankFold``); ``snapshot()``
freezes the ranks that changed since the last one.  A tree that every rank
sends alike is checked once, and what a shards snapshot holds per device is
summed once, when it arrives (``Holdings``).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType

from shardtop.read.event_checks import fits, same_tree, shards_problem, tree_problem
from shardtop.read.memory_growth import StepMemory
from shardtop.rundir.events import (
    AnyEvent,
    Exit,
    Fault,
    Hello,
    Kept,
    Memory,
    Oom,
    Phase,
    PhaseName,
    Planned,
    Shards,
    Step,
    Tree,
    tree_paths,
)
from shardtop.rundir.memory_figures import GpuMemory, MemorySplit

MEMORY_HISTORY = 120
"""Samples of allocator memory kept per rank for sparklines."""
STEP_SECONDS_KEPT = 16
"""Recent step durations kept per rank: their median is the rank's usual step."""
STEP_MEMORY_KEPT = 256
"""Steps of memory kept per rank for the growth fit; past it the older half is thinned to every other."""

TRAINING_PHASES: frozenset[PhaseName] = frozenset({"forward", "backward", "optimizer"})
"""Phases in which every rank runs the same code: samples taken in them can be compared rank to rank."""

PHASE_SAMPLES_KEPT = 12
"""(step, phase) keys kept per rank for rank-to-rank comparisons; older keys fall out."""

GPU_SAMPLES_KEPT = 12
"""NVML samples taken during training kept per host."""

STORED_NOWHERE = frozenset({"meta"})
"""Devices that store nothing (deferred initialisation)."""


@dataclass(frozen=True)
class Holdings:
    """What one shards snapshot says its rank stores: parameter bytes per device, gradients, optimizer state."""

    by_device: Mapping[str, int]
    """Stored parameter bytes per device (meta excluded)."""
    grad_bytes: int | None
    optim_bytes: int | None

    @property
    def param_bytes(self) -> int:
        return sum(self.by_device.values())


def holdings_of(shards: Shards) -> Holdings:
    """Summed over the tree once per snapshot: views ask every refresh, for every rank."""
    by_device: dict[str, int] = {}
    for b, d in zip(shards.bytes, shards.device, strict=True):
        if b and 0 <= d < len(shards.devices) and shards.devices[d] not in STORED_NOWHERE:
            name = shards.devices[d]
            by_device[name] = by_device.get(name, 0) + b
    return Holdings(
        by_device=MappingProxyType(by_device),
        grad_bytes=None if shards.grad_bytes is None else sum(shards.grad_bytes),
        optim_bytes=None if shards.optim_bytes is None else sum(shards.optim_bytes),
    )


@dataclass(frozen=True, slots=True)
class PhaseSample:
    """A rank's latest memory sample taken in one step and phase."""

    step: int
    phase: str
    memory: Memory


@dataclass(frozen=True, slots=True)
class GpuSample:
    """One NVML reading of a host's GPUs, with when and in which phase the sampling rank took it."""

    t: float
    rank: int
    step: int
    phase: str
    gpus: tuple[GpuMemory, ...]


@dataclass(frozen=True, slots=True)
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
    split: MemorySplit | None = None
    """The latest split of the rank's memory by kind (samples taken at a phase change carry one)."""
    peak_split: MemorySplit | None = None
    """The latest split at the rank's peak so far (the probe writes it when it changes)."""
    process_sample: Memory | None = None
    """The latest sample with NVML's count of the process's device memory (not every sample has one)."""
    phase_samples: tuple[PhaseSample, ...] = ()
    """The latest sample of each recent (step, phase) in a training phase, oldest first."""
    step_memory: tuple[StepMemory, ...] = ()
    """Memory at the start of each step's forward, oldest first (thinned past ``STEP_MEMORY_KEPT``)."""
    kept: Kept | None = None
    """The latest trace of tensors kept across steps."""
    progress_t: float | None = None
    """When the rank last entered a phase or finished a step."""
    step_seconds: tuple[float, ...] = ()
    """How long its recent steps took, oldest first."""
    shards: Shards | None = None
    """The latest shards for the current tree."""
    holdings: Holdings | None = None
    """What ``shards`` hold, summed."""
    setup_shards: Shards | None = None
    """How the rank held the model before the engine wrapped it (stage ``setup``)."""
    setup_holdings: Holdings | None = None
    """What ``setup_shards`` hold, summed."""
    engine_wrapped: bool = False
    """A snapshot was taken after the engine wrapped the model (a set-up OOM's snapshot is not one):
    ``shards`` then say how the engine holds it, else how set-up left it."""
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


def _peak_of(m: Memory) -> int:
    peak, allocated = m.peak or 0, m.allocated or 0
    return peak if peak > allocated else allocated


@dataclass(slots=True)
class _RankFold:
    """One rank while events are applied: changed in place, frozen into a ``RankState`` by ``freeze()``.

    An event changes a field or two here instead of copying the rank's state,
    so following 512 ranks allocates next to nothing per event.
    """

    rank: int
    host: str = ""
    hello: Hello | None = None
    phase: str = ""
    step: int = 0
    last_step: Step | None = None
    memory: Memory | None = None
    peak_memory: Memory | None = None
    history: deque[int] = field(default_factory=lambda: deque(maxlen=MEMORY_HISTORY))
    peak_host_rss: int = 0
    split: MemorySplit | None = None
    peak_split: MemorySplit | None = None
    process_sample: Memory | None = None
    samples: list[PhaseSample] = field(default_factory=list)
    """The latest sample of each recent training step and phase, oldest first."""
    step_memory: list[StepMemory] = field(default_factory=list)
    kept: Kept | None = None
    progress_t: float | None = None
    step_seconds: deque[float] = field(default_factory=lambda: deque(maxlen=STEP_SECONDS_KEPT))
    shards: Shards | None = None
    holdings: Holdings | None = None
    setup_shards: Shards | None = None
    setup_holdings: Holdings | None = None
    engine_wrapped: bool = False
    oom: Oom | None = None
    exit: Exit | None = None
    faults: tuple[Fault, ...] = ()
    frozen: RankState | None = None
    """The rank as the last snapshot showed it; None once an event changed it."""

    def freeze(self) -> RankState:
        if self.frozen is None:
            self.frozen = RankState(
                rank=self.rank,
                host=self.host,
                hello=self.hello,
                phase=self.phase,
                step=self.step,
                last_step=self.last_step,
                memory=self.memory,
                peak_memory=self.peak_memory,
                allocated_history=tuple(self.history),
                peak_host_rss=self.peak_host_rss,
                split=self.split,
                peak_split=self.peak_split,
                process_sample=self.process_sample,
                phase_samples=tuple(self.samples),
                step_memory=tuple(self.step_memory),
                kept=self.kept,
                progress_t=self.progress_t,
                step_seconds=tuple(self.step_seconds),
                shards=self.shards,
                holdings=self.holdings,
                setup_shards=self.setup_shards,
                setup_holdings=self.setup_holdings,
                engine_wrapped=self.engine_wrapped,
                oom=self.oom,
                exit=self.exit,
                faults=self.faults,
            )
        return self.frozen

    def sample(self, m: Memory) -> None:
        """Keep ``m`` as the latest sample of the current training step and phase."""
        samples, step, phase = self.samples, self.step, self.phase
        latest = PhaseSample(step, phase, m)
        if samples and samples[-1].step == step and samples[-1].phase == phase:
            samples[-1] = latest  # the usual case: another sample of the same step and phase
            return
        samples[:] = [p for p in samples if p.step != step or p.phase != phase]
        samples.append(latest)
        del samples[:-PHASE_SAMPLES_KEPT]


class RunStateBuilder:
    """Applies events in order and hands out immutable ``RunState`` snapshots."""

    def __init__(self) -> None:
        self._state = RunState()
        self._ranks: dict[int, _RankFold] = {}
        self._gpus: dict[str, tuple[GpuMemory, ...]] = {}
        self._gpu_samples: dict[str, tuple[GpuSample, ...]] = {}
        self._events = 0
        self.structure = 0
        """Counts what a view must show at once: a rank seen first, its hello, a tree, shards, an OOM, an exit."""
        self._first_t: float | None = None
        self._last_t: float | None = None
        self._dirty = False

    def apply(self, events: Iterable[AnyEvent]) -> None:
        for event in events:
            self._apply_one(event)

    def note_skipped(self, skipped: Mapping[str, int]) -> None:
        """The reader's skip counts so far (``EventReader.skipped``)."""
        counted = {k: v for k, v in skipped.items() if v}
        if counted != self._state.skipped_by:  # a new state only when a count moved: views compare states
            self._state = replace(self._state, skipped_by=MappingProxyType(counted))

    def snapshot(self) -> RunState:
        if self._dirty:
            self._state = replace(
                self._state,
                events=self._events,
                first_t=self._first_t,
                last_t=self._last_t,
                ranks=MappingProxyType({rank: r.freeze() for rank, r in self._ranks.items()}),
                gpus=MappingProxyType(dict(self._gpus)),
                gpu_samples=MappingProxyType(dict(self._gpu_samples)),
            )
            self._dirty = False
        return self._state

    def _rank(self, event: AnyEvent) -> _RankFold:
        r = self._ranks.get(event.rank)
        if r is None:
            self.structure += 1
            r = self._ranks[event.rank] = _RankFold(rank=event.rank, host=event.host)
        r.frozen = None
        return r

    def _reject(self) -> None:
        self._state = replace(self._state, inconsistent=self._state.inconsistent + 1)

    def _apply_one(self, event: AnyEvent) -> None:
        self._events += 1
        t = event.t
        if self._first_t is None or t < self._first_t:
            self._first_t = t
        if self._last_t is None or t > self._last_t:
            self._last_t = t
        self._dirty = True
        if isinstance(event, Tree):
            self._apply_tree(event)
            return
        if isinstance(event, Planned):
            self._state = replace(self._state, plan=event)
            self.structure += 1
            return
        if not isinstance(event, (Memory, Phase, Step)):
            self.structure += 1
        if isinstance(event, Shards) and (shards_problem(event) or not fits(event, self._state.tree)):
            self._reject()
            return
        r = self._rank(event)
        if isinstance(event, Memory):
            self._apply_memory(r, event)
        elif isinstance(event, Phase):
            r.phase, r.step, r.progress_t = event.phase, max(r.step, event.step), event.t
        elif isinstance(event, Step):
            took = event.seconds if event.seconds is not None else (
                event.t - r.last_step.t if r.last_step is not None and event.step > r.last_step.step else None)
            if took is not None and took >= 0:
                r.step_seconds.append(took)
            r.last_step, r.step, r.progress_t = event, max(r.step, event.step), event.t
        elif isinstance(event, Kept):
            r.kept = event
        elif isinstance(event, Hello):
            r.hello, r.host = event, event.host
        elif isinstance(event, Shards):
            tree = self._state.tree
            held = holdings_of(event)
            if event.stage == "setup":
                r.setup_shards, r.setup_holdings = event, held
            elif event.stage != "oom" or r.engine_wrapped:  # an OOM in set-up is still before the engine
                r.engine_wrapped = True
            if tree is None or event.tree_id == tree.tree_id:
                r.shards, r.holdings = event, held
        elif isinstance(event, Oom):
            if r.oom is None:  # a rank runs out once; a second record (a retry) keeps the first
                r.oom, r.phase = event, event.phase
            if event.gpus is not None:
                self._gpus[event.host] = tuple(event.gpus)
        elif isinstance(event, Exit):
            r.exit = event
        elif isinstance(event, Fault):
            r.faults = (*r.faults, event)

    def _apply_tree(self, tree: Tree) -> None:
        current = self._state.tree
        if current is not None and same_tree(tree, current):
            return  # another rank's copy of the tree in hand: checked and applied already
        if tree_problem(tree):
            self._reject()
            return
        self.structure += 1
        if current is None or tree.tree_id >= current.tree_id:
            self._state = replace(self._state, tree=tree, paths=tuple(tree_paths(tree.names, tree.parents)))
            for r in self._ranks.values():
                if r.shards is not None and (r.shards.tree_id != tree.tree_id or not fits(r.shards, tree)):
                    r.shards, r.holdings, r.frozen = None, None, None

    def _apply_memory(self, r: _RankFold, m: Memory) -> None:
        r.history.append(m.allocated or m.host_rss)
        if r.phase == "forward" and r.step > 0 and (not r.step_memory or r.step_memory[-1].step < r.step):
            value = m.allocated if m.allocated is not None else m.host_heap if m.host_heap is not None else m.host_rss
            r.step_memory.append(StepMemory(step=r.step, bytes=value, t=m.t))
            if len(r.step_memory) > STEP_MEMORY_KEPT:  # thin the older half: the fit keeps its span
                half = STEP_MEMORY_KEPT // 2
                r.step_memory[:half] = r.step_memory[:half:2]
        if r.peak_memory is None or _peak_of(m) >= _peak_of(r.peak_memory):
            r.peak_memory = m
        training = r.phase in TRAINING_PHASES
        if training and r.exit is None and r.oom is None:
            r.sample(m)
        if m.gpus is not None:
            gpus = tuple(m.gpus)
            self._gpus[m.host] = gpus
            if training:
                sample = GpuSample(m.t, m.rank, r.step, r.phase, gpus)
                self._gpu_samples[m.host] = (self._gpu_samples.get(m.host, ()) + (sample,))[-GPU_SAMPLES_KEPT:]
        r.peak_host_rss = max(r.peak_host_rss, m.host_rss)
        if m.split is not None:
            r.split = m.split
        if m.peak_split is not None:
            r.peak_split = m.peak_split
        if m.process_used is not None:
            r.process_sample = m
        r.memory = m


def fold(events: Iterable[AnyEvent], skipped: Mapping[str, int] | None = None) -> RunState:
    """A snapshot of a whole event list at once (``skipped``: the reader's skip counts)."""
    builder = RunStateBuilder()
    builder.apply(events)
    builder.note_skipped(skipped or {})
    return builder.snapshot()
