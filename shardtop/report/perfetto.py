"""``shardtop report RUN --format perfetto``: the run as a trace for Perfetto and chrome://tracing.

The file is in the JSON trace event format: ``{"traceEvents": [...], "displayTimeUnit": "ms",
"otherData": {...}}``, one event a line.  Each rank is a process named ``rank R (host, device)``
with two threads, its phases and its steps, each a run of complete slices (``X``) that never
overlap, and its memory as counters (``C``) of that process:

- ``memory``: bytes by kind (params, grads, optimizer, activations, kept, script, comm, workspace,
  other, and unexplained where the allocator was read), from each split the rank recorded.  A kind
  the rank measured at some moment reads 0 in a sample that did not measure it; on CUDA its bytes are
  then in unexplained, so the kinds add up to ``allocated``;
- ``allocator``: allocated and reserved bytes, where the rank read its allocator (CUDA);
- ``host``: the rank's resident host memory.

The OOM is an instant (``i``) on the phases thread, named after its module, with the message and
the figures of the OOM; the rank's exit and the probe's faults are instants there too.

A phase lasts until the rank's next phase, its OOM or its exit (for a rank still running, its last
event); a step from the end of the step before, or the time it says it took, to its end.
Timestamps are microseconds since the run's first event, whose wall-clock time is in ``otherData``.

Pure apart from ``render_trace``, which reads the run: the read model names the ranks and tells the
OOM, and the events themselves, in order, give the timeline the model does not keep.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

import msgspec

from shardtop import __version__
from shardtop.read.memory_kinds import KINDS
from shardtop.read.oom_story import OomStory
from shardtop.read.rank_facts import RankFacts
from shardtop.read.run_model import RunModel
from shardtop.read.whole_run import read_run
from shardtop.rundir.event_files import read_all
from shardtop.rundir.events import FAULT_PARTS, AnyEvent, Exit, Fault, Memory, Oom, Phase, Step
from shardtop.rundir.memory_figures import MemorySplit
from shardtop.rundir.run_directory import RunDirectory

Ph = Literal["X", "C", "i", "M"]
"""The event types the trace uses: complete slice, counter, instant, metadata."""

ArgValue = str | int | float | bool | None

STEPS_TID_BASE = 1 << 20
"""The steps thread of rank R has thread id ``STEPS_TID_BASE + R``; its phases thread is the process's
main thread (thread id = process id = R + 1), so no thread id is also another rank's process id."""

PHASES_THREAD = "phases"
STEPS_THREAD = "steps"
MEMORY_COUNTER = "memory"
ALLOCATOR_COUNTER = "allocator"
HOST_COUNTER = "host"


class TraceEvent(msgspec.Struct, omit_defaults=True, frozen=True):
    """One event of the trace event format, as it is written."""

    name: str
    ph: Ph
    pid: int
    tid: int
    ts: int | None = None
    """Microseconds since the run's first event (metadata events have none)."""
    dur: int | None = None
    """A complete slice's length, in microseconds."""
    s: Literal["t", "p", "g"] | None = None
    """An instant's scope: its thread."""
    cat: str | None = None
    args: dict[str, ArgValue] | None = None


@dataclass(frozen=True)
class RankTrack:
    """Where one rank's events go: its process and its two threads."""

    rank: int
    name: str

    @property
    def pid(self) -> int:
        return self.rank + 1

    @property
    def phases_tid(self) -> int:
        return self.pid

    @property
    def steps_tid(self) -> int:
        return STEPS_TID_BASE + self.rank


def track_name(r: RankFacts) -> str:
    """``rank 1 (gpu-node-3, cuda:1)``."""
    where = ", ".join(part for part in (r.host, r.device) if part)
    return f"rank {r.rank} ({where})" if where else f"rank {r.rank}"


@dataclass
class _Clock:
    """Seconds since the epoch to microseconds since the run's first event."""

    t0: float

    def us(self, t: float) -> int:
        return round((t - self.t0) * 1_000_000)


@dataclass
class _RankTimeline:
    """Walks one rank's events in order and makes its slices, counters and instants."""

    track: RankTrack
    clock: _Clock
    kinds: tuple[str, ...]
    """The kinds this rank measured in some split: the ``memory`` counter's series."""
    story: OomStory | None
    out: list[TraceEvent] = field(default_factory=list)
    _phase: Phase | None = None
    _step_end: float | None = None
    _first_of_step: dict[int, float] = field(default_factory=dict)

    def walk(self, events: Sequence[AnyEvent]) -> list[TraceEvent]:
        for e in events:
            if isinstance(e, Phase):
                self._close_phase(e.t)
                self._phase = e
                self._first_of_step.setdefault(e.step, e.t)
            elif isinstance(e, Step):
                self._step(e, events[0].t)
            elif isinstance(e, Memory):
                self._memory(e.t, e.split, e.allocated, e.reserved, e.host_rss)
            elif isinstance(e, Oom):
                self._close_phase(e.t)
                self._memory(e.t, e.memory, e.allocated, e.reserved, 0)
                self._oom(e)
            elif isinstance(e, Exit):
                self._close_phase(e.t)
                self._instant(e.t, f"exit: {e.status}", {"code": e.code, "status": e.status, "error": e.error,
                                                         "signal": e.signal})
            elif isinstance(e, Fault):
                self._instant(e.t, f"probe fault: {FAULT_PARTS.get(e.part, e.part)}", {"error": e.error})
        if events:
            self._close_phase(events[-1].t)
        return self.out

    def _close_phase(self, t: float) -> None:
        p = self._phase
        if p is None:
            return
        self._phase = None
        start = self.clock.us(p.t)
        self.out.append(TraceEvent(
            name=p.phase, ph="X", pid=self.track.pid, tid=self.track.phases_tid, ts=start,
            dur=max(0, self.clock.us(t) - start), cat="phase", args={"step": p.step},
        ))

    def _step(self, s: Step, rank_start: float) -> None:
        begun = s.t - s.seconds if s.seconds is not None else self._first_of_step.get(s.step)
        if begun is None:
            begun = self._step_end if self._step_end is not None else rank_start
        if self._step_end is not None:
            begun = max(begun, self._step_end)  # one step after another on one thread: never overlapping
        start = self.clock.us(min(begun, s.t))
        self.out.append(TraceEvent(
            name=f"step {s.step}", ph="X", pid=self.track.pid, tid=self.track.steps_tid, ts=start,
            dur=self.clock.us(s.t) - start, cat="step", args={"step": s.step, "loss": s.loss, "seconds": s.seconds},
        ))
        self._step_end = max(s.t, self._step_end or s.t)

    def _memory(self, t: float, split: MemorySplit | None, allocated: int | None, reserved: int | None,
                host_rss: int) -> None:
        ts = self.clock.us(t)
        track = self.track
        if split is not None and self.kinds:
            by_kind: dict[str, ArgValue] = {k: getattr(split.by_kind, k) or 0 for k in self.kinds}
            if split.allocated is not None:
                by_kind["unexplained"] = split.unexplained or 0
            self.out.append(TraceEvent(name=MEMORY_COUNTER, ph="C", pid=track.pid, tid=track.phases_tid, ts=ts,
                                       args=by_kind))
        if allocated is not None:
            held: dict[str, ArgValue] = {"allocated": allocated}
            if reserved is not None:
                held["reserved"] = reserved
            self.out.append(TraceEvent(name=ALLOCATOR_COUNTER, ph="C", pid=track.pid, tid=track.phases_tid, ts=ts,
                                       args=held))
        if host_rss > 0:
            self.out.append(TraceEvent(name=HOST_COUNTER, ph="C", pid=track.pid, tid=track.phases_tid, ts=ts,
                                       args={"rss": host_rss}))

    def _oom(self, o: Oom) -> None:
        story = self.story if self.story is not None and self.story.oom == o else None  # the model's own copy
        facts: dict[str, ArgValue] = {
            "module": o.module,
            "module_type": story.module_type if story is not None else o.module_type,
            "phase": o.phase,
            "step": o.step,
            "requested_bytes": o.requested_bytes,
            "allocated": o.allocated,
            "reserved": o.reserved,
            "limit": o.limit,
            "found_by": story.found_by if story is not None else o.attributed_by,
            "engine_step": o.engine_step,
            "message": o.message,
        }
        name = f"out of memory in {o.module}" if o.module else "out of memory"
        self._instant(o.t, name, facts)

    def _instant(self, t: float, name: str, args: Mapping[str, ArgValue]) -> None:
        self.out.append(TraceEvent(
            name=name, ph="i", pid=self.track.pid, tid=self.track.phases_tid, ts=self.clock.us(t), s="t",
            args={k: v for k, v in args.items() if v is not None},
        ))


def measured_kinds(events: Iterable[AnyEvent]) -> tuple[str, ...]:
    """The kinds some split among ``events`` measured, in ``KINDS`` order."""
    seen: set[str] = set()
    for e in events:
        split = e.split if isinstance(e, Memory) else e.memory if isinstance(e, Oom) else None
        if split is not None:
            seen.update(k for k in KINDS if getattr(split.by_kind, k) is not None)
    return tuple(k for k in KINDS if k in seen)


def _metadata(track: RankTrack) -> list[TraceEvent]:
    pid = track.pid
    return [
        TraceEvent(name="process_name", ph="M", pid=pid, tid=pid, args={"name": track.name}),
        TraceEvent(name="process_sort_index", ph="M", pid=pid, tid=pid, args={"sort_index": track.rank}),
        TraceEvent(name="thread_name", ph="M", pid=pid, tid=track.phases_tid, args={"name": PHASES_THREAD}),
        TraceEvent(name="thread_sort_index", ph="M", pid=pid, tid=track.phases_tid, args={"sort_index": 0}),
        TraceEvent(name="thread_name", ph="M", pid=pid, tid=track.steps_tid, args={"name": STEPS_THREAD}),
        TraceEvent(name="thread_sort_index", ph="M", pid=pid, tid=track.steps_tid, args={"sort_index": 1}),
    ]


@dataclass(frozen=True)
class Trace:
    """A run's trace: its events and what ``otherData`` says of the run."""

    events: tuple[TraceEvent, ...]
    other: Mapping[str, ArgValue]

    def to_json(self) -> str:
        """The JSON object format, one event a line (a long run stays greppable)."""
        encode = msgspec.json.encode
        body = ",\n".join(encode(e).decode() for e in self.events)
        tail = encode({"displayTimeUnit": "ms", "otherData": dict(self.other)}).decode()
        return '{"traceEvents":[\n' + body + "\n]," + tail[1:]


def build_trace(model: RunModel, events: Sequence[AnyEvent], run_id: str = "") -> Trace:
    """The trace of a run from its read model and its events (in any order of the ranks' files)."""
    by_rank: dict[int, list[AnyEvent]] = {}
    for e in events:
        by_rank.setdefault(e.rank, []).append(e)
    starts = [e.t for e in events]
    clock = _Clock(min(starts) if starts else 0.0)
    stories = {s.rank: s for s in model.ooms}
    out: list[TraceEvent] = []
    for r in model.ranks:
        track = RankTrack(r.rank, track_name(r))
        mine = sorted(by_rank.get(r.rank, ()), key=lambda e: e.t)
        out += _metadata(track)
        out += _RankTimeline(track, clock, measured_kinds(mine), stories.get(r.rank)).walk(mine)
    other: dict[str, ArgValue] = {
        "run": run_id or None,
        "started": clock.t0 if starts else None,
        "ranks": len(model.ranks),
        "world_size": model.world_size,
        "engine": model.engine or None,
        "made_by": f"shardtop {__version__}",
    }
    return Trace(tuple(out), {k: v for k, v in other.items() if v is not None})


def render_trace(run: RunDirectory) -> str:
    """``shardtop report RUN --format perfetto``."""
    events, _ = read_all(run.events_dir)
    return build_trace(read_run(run), events, run.id).to_json()
