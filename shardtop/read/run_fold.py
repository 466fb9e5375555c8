"""Fold a run's events into ``RunState`` snapshots (``run_state``).

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
summed once, when it arrives (``holdings_of``).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType

from shardtop.read.event_checks import fits, same_tree, shards_problem, tree_problem
from shardtop.read.memory_growth import StepMemory
from shardtop.read.run_state import TRAINING_PHASES, GpuSample, Holdings, PhaseSample, RankState, RunState, holdings_of
from shardtop.rundir.events import (
    AnyEvent,
    Exit,
    Fault,
    Hello,
    Kept,
    Memory,
    Oom,
    Phase,
    Planned,
    Shards,
    Snapshot,
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

PHASE_SAMPLES_KEPT = 12
"""(step, phase) keys kept per rank for rank-to-rank comparisons; older keys fall out."""

GPU_SAMPLES_KEPT = 12
"""NVML samples taken during training kept per host."""


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
    # By the event that changes them: a hello,
    hello: Hello | None = None
    host: str = ""
    # a phase or a step,
    phase: str = ""
    step: int = 0
    progress_t: float | None = None
    last_step: Step | None = None
    step_seconds: deque[float] = field(default_factory=lambda: deque(maxlen=STEP_SECONDS_KEPT))
    # a memory sample,
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
    # tensors kept across steps, an allocator snapshot,
    kept: Kept | None = None
    snapshots: dict[str, Snapshot] = field(default_factory=dict)
    # shards,
    shards: Shards | None = None
    holdings: Holdings | None = None
    setup_shards: Shards | None = None
    setup_holdings: Holdings | None = None
    engine_wrapped: bool = False
    # an OOM, an exit, a probe fault.
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
                snapshots=tuple(self.snapshots.values()),
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
            took = (
                event.seconds
                if event.seconds is not None
                else (event.t - r.last_step.t if r.last_step is not None and event.step > r.last_step.step else None)
            )
            if took is not None and took >= 0:
                r.step_seconds.append(took)
            r.last_step, r.step, r.progress_t = event, max(r.step, event.step), event.t
        elif isinstance(event, Kept):
            r.kept = event
        elif isinstance(event, Snapshot):
            r.snapshots[event.moment] = event
        elif isinstance(event, Hello):
            r.hello, r.host = event, event.host
        elif isinstance(event, Shards):
            tree = self._state.tree
            held = holdings_of(event)
            if event.stage == "setup" or (event.stage == "oom" and not r.engine_wrapped and r.setup_shards is None):
                r.setup_shards, r.setup_holdings = event, held  # an OOM before any set-up snapshot: the build's
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
