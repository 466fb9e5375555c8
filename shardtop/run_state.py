"""Fold a run's events into one immutable snapshot: what the TUI, the report and
the diagnosis read.  Pure Python: no torch, no textual.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType

from shardtop.events import (
    AnyEvent,
    Exit,
    GpuMemory,
    Hello,
    Memory,
    Oom,
    Phase,
    Shards,
    Step,
    Tree,
    tree_paths,
)

MEMORY_HISTORY = 120
"""Samples of allocator memory kept per rank for sparklines."""


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
    allocated_history: tuple[int, ...] = ()
    shards: Shards | None = None
    """The latest shards for the current tree."""
    setup_shards: Shards | None = None
    """How the rank held the model before the engine wrapped it (stage ``setup``)."""
    oom: Oom | None = None
    exit: Exit | None = None

    @property
    def device(self) -> str:
        if self.hello is not None:
            return self.hello.device
        return self.memory.device if self.memory else ""

    @property
    def pid(self) -> int | None:
        return self.hello.pid if self.hello else None


@dataclass(frozen=True)
class RunState:
    """Everything known about a run from its events, at one moment."""

    tree: Tree | None = None
    paths: tuple[str, ...] = ()
    ranks: Mapping[int, RankState] = field(default_factory=lambda: MappingProxyType({}))
    gpus: Mapping[str, tuple[GpuMemory, ...]] = field(default_factory=lambda: MappingProxyType({}))
    """The latest NVML sample of each host's GPUs."""
    skipped: int = 0
    events: int = 0
    first_t: float | None = None
    last_t: float | None = None

    @property
    def world_size(self) -> int:
        for r in self.ranks.values():
            if r.hello is not None:
                return r.hello.world_size
        return len(self.ranks)

    @property
    def engine(self) -> str:
        """The engine as the ranks hold the model; before it wrapped the model, what hello announced."""
        ranks = sorted(self.ranks.values(), key=lambda r: r.rank)
        for r in ranks:
            if r.shards is not None and r.shards.engine and r.shards.stage != "setup":
                return r.shards.engine
        for r in ranks:
            if r.hello is not None and r.hello.engine:
                return r.hello.engine
        for r in ranks:
            if r.shards is not None and r.shards.engine:
                return r.shards.engine
        return ""

    @property
    def ooms(self) -> list[Oom]:
        return [r.oom for r in sorted(self.ranks.values(), key=lambda r: r.rank) if r.oom is not None]

    @property
    def step(self) -> int:
        return max((r.step for r in self.ranks.values()), default=0)

    @property
    def hosts(self) -> list[str]:
        return sorted({r.host for r in self.ranks.values() if r.host})

    def row_of(self, path: str) -> int | None:
        try:
            return self.paths.index(path)
        except ValueError:
            return None


class RunStateBuilder:
    """Applies events in order and hands out immutable ``RunState`` snapshots."""

    def __init__(self) -> None:
        self._state = RunState()
        self._ranks: dict[int, RankState] = {}
        self._gpus: dict[str, tuple[GpuMemory, ...]] = {}
        self._dirty = False

    def apply(self, events: Iterable[AnyEvent]) -> None:
        for event in events:
            self._apply_one(event)

    def note_skipped(self, count: int) -> None:
        if count != self._state.skipped:
            self._state = replace(self._state, skipped=count)

    def snapshot(self) -> RunState:
        if self._dirty:
            self._state = replace(
                self._state,
                ranks=MappingProxyType(dict(self._ranks)),
                gpus=MappingProxyType(dict(self._gpus)),
            )
            self._dirty = False
        return self._state

    def _rank(self, event: AnyEvent) -> RankState:
        return self._ranks.get(event.rank) or RankState(rank=event.rank, host=event.host)

    def _apply_one(self, event: AnyEvent) -> None:
        s = self._state
        self._state = replace(
            s,
            events=s.events + 1,
            first_t=event.t if s.first_t is None else min(s.first_t, event.t),
            last_t=event.t if s.last_t is None else max(s.last_t, event.t),
        )
        if isinstance(event, Tree):
            if self._state.tree is None or event.tree_id >= self._state.tree.tree_id:
                self._state = replace(
                    self._state, tree=event, paths=tuple(tree_paths(event.names, event.parents))
                )
                for rank, rs in self._ranks.items():
                    if rs.shards is not None and rs.shards.tree_id != event.tree_id:
                        self._ranks[rank] = replace(rs, shards=None)
            self._dirty = True
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
            history = (rs.allocated_history + (event.allocated or event.host_rss,))[-MEMORY_HISTORY:]
            rs = replace(rs, memory=event, allocated_history=history)
            if event.gpus is not None:
                self._gpus[event.host] = tuple(event.gpus)
        elif isinstance(event, Phase):
            rs = replace(rs, phase=event.phase, step=max(rs.step, event.step))
        elif isinstance(event, Step):
            rs = replace(rs, last_step=event, step=max(rs.step, event.step))
        elif isinstance(event, Oom):
            rs = replace(rs, oom=event, phase=event.phase)
            if event.gpus is not None:
                self._gpus[event.host] = tuple(event.gpus)
        elif isinstance(event, Exit):
            rs = replace(rs, exit=event)
        self._ranks[event.rank] = rs
        self._dirty = True


def fold(events: Iterable[AnyEvent], skipped: int = 0) -> RunState:
    """A snapshot of a whole event list at once."""
    builder = RunStateBuilder()
    builder.apply(events)
    builder.note_skipped(skipped)
    return builder.snapshot()
