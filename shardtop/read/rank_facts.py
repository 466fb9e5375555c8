"""One rank of a run: how it stands (``RankStatus``), and who it is with its holdings (``RankFacts``).

A rank's status comes from its own records first (its exit, its OOM), then its
supervisor's (``exit.json``), then the run's liveness; its holdings are summed
once over the tree.  ``RunModel`` builds one ``RankFacts`` per rank, and the
plan check, the views and the rules read them.  Pure Python: no torch, no
textual, no I/O.
"""

from __future__ import annotations

import signal as signals
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Literal

from shardtop.read.memory_kinds import total_of
from shardtop.read.run_state import NOTHING_OFFLOADED, Offloaded, RankState
from shardtop.rundir.events import Exit, Hello, Memory, Oom, Shards
from shardtop.rundir.memory_figures import MemorySplit
from shardtop.rundir.run_status import RankExit, RunStatus

RankStateName = Literal[
    "starting", "running", "stalled", "finished", "failed", "out of memory", "interrupted", "killed", "lost"
]
"""How a rank stands (``RankStatus.state``), worked out from its records by ``rank_status``."""

RANK_MARKS: Mapping[str, str] = MappingProxyType(
    {
        "starting": "…",
        "running": "●",
        "stalled": "‖",
        "finished": "✓",
        "failed": "✗",
        "out of memory": "✗",
        "interrupted": "■",
        "killed": "✗",
        "lost": "?",
    }
)
"""A symbol beside each rank status, so no view says it in colour alone."""


@dataclass(frozen=True, slots=True)
class RankStatus:
    """How one rank stands: from its own exit record, its OOM, and the run's liveness."""

    state: RankStateName
    detail: str = ""

    @property
    def words(self) -> str:
        return self.state + (f" ({self.detail})" if self.detail else "")

    @property
    def mark(self) -> str:
        return RANK_MARKS[self.state]

    @property
    def ended(self) -> bool:
        return self.state not in ("starting", "running", "stalled")


SEVERITY: tuple[RankStateName, ...] = (
    "finished", "running", "starting", "stalled", "interrupted", "lost", "killed", "failed", "out of memory"
)
"""Rank states from the best to the worst: a group of ranks (a host's) is told by its worst."""


def worst_status(statuses: Iterable[RankStatus]) -> RankStatus | None:
    """The worst of ``statuses`` (the first of equals); None for none."""
    return max(statuses, key=lambda s: SEVERITY.index(s.state), default=None)


def _signal_name(number: int) -> str:
    try:
        return signals.Signals(number).name
    except ValueError:
        return f"signal {number}"


def rank_status(rs: RankState, run: RunStatus | None) -> RankStatus:
    """From the rank's own records first (its exit, its OOM), then its supervisor's (``exit.json``),
    then the run's liveness (``run``: None when not known)."""
    record = _supervisor_record(run, rs.rank)
    peers = run.exit.peers_stopped if run is not None and run.exit is not None else None
    stopped_after = f"stopped after rank {peers.after_rank} failed" if peers is not None else "stopped by shardtop"
    e = rs.exit
    if e is not None:
        status = _exit_status(e)
        if status.state == "interrupted" and record is not None and record.stopped:
            return RankStatus("interrupted", stopped_after)
        if status.state == "failed" and _failed_in_a_stop(e, record, run):
            return RankStatus("interrupted", f"{stopped_after}; it failed as it stopped: {status.detail}")
        return status
    if rs.oom is not None:
        return RankStatus("out of memory")
    if record is not None:
        if record.stopped:
            return RankStatus("interrupted", stopped_after)
        if record.signal:
            return RankStatus("killed", _signal_name(record.signal))
        return RankStatus("finished") if record.code == 0 else RankStatus("failed", f"exit {record.code}")
    if run is not None and run.state != "running":
        return RankStatus("lost", "it left no exit record: killed hard, or its host went away")
    if rs.hello is None:
        return RankStatus("starting")
    return RankStatus("running")


STOP_CLOCK_SLACK_S = 1.0
"""A rank's exit this much before the stop was asked still counts as the stop's (clocks of one host)."""


def _failed_in_a_stop(e: Exit, record: RankExit | None, run: RunStatus | None) -> bool:
    """The rank failed because the run was being stopped: its supervisor had signalled it, or it ended
    after the stop was asked for (a peer that died of the stop broke its collective)."""
    if record is not None and record.stopped:
        return True
    asked = run.exit.stop_requested if run is not None and run.exit is not None else None
    return asked is not None and e.t >= asked - STOP_CLOCK_SLACK_S


def _supervisor_record(run: RunStatus | None, rank: int) -> RankExit | None:
    if run is None or run.exit is None:
        return None
    return next((r for r in run.exit.ranks if r.rank == rank), None)


def _exit_status(e: Exit) -> RankStatus:
    if e.status == "ok":
        return RankStatus("finished")
    if e.status == "oom":
        return RankStatus("out of memory")
    if e.status == "interrupted":
        return RankStatus("interrupted", _signal_name(e.signal) if e.signal else _first_line(e.error))
    # a SystemExit carrying a signal's exit status (128 + n) is a signal, not a failure
    if e.code > 128 and e.code - 128 in (signals.SIGTERM, signals.SIGINT, signals.SIGHUP):
        return RankStatus("interrupted", _signal_name(e.code - 128))
    return RankStatus("failed", _first_line(e.error) or f"exit {e.code}")


DETAIL_CHARS = 80


def _first_line(text: str | None) -> str:
    """A status detail short enough for a table cell: the first line of an error, cut at a word."""
    line = (text or "").strip().splitlines()[0] if (text or "").strip() else ""
    return line if len(line) <= DETAIL_CHARS else line[: DETAIL_CHARS - 1].rsplit(" ", 1)[0] + " …"


PEAK_SPLIT_NEAR = 0.95
"""A split is the peak's when its allocated bytes are within 5 % of the allocator's peak."""


@dataclass(frozen=True, slots=True)
class OnDevice:
    """What a rank holds on its own device: its parameters, gradients and optimizer state less what the
    engine's offload policy holds in host memory; None where the kind was not recorded."""

    params: int | None
    grads: int | None
    optimizer: int | None


@dataclass(frozen=True, slots=True)
class RankFacts:
    """One rank: who it is, how it stands, and its holdings summed over the tree."""

    rank: int
    host: str
    device: str
    pid: int | None
    status: RankStatus
    state: RankState
    shards: Shards | None
    """The latest snapshot taken once the engine held the model (not ``setup``)."""
    setup: Shards | None
    param_bytes: int = 0
    grad_bytes: int | None = None
    optim_bytes: int | None = None
    by_device: Mapping[str, int] = field(default_factory=dict)
    """Stored parameter bytes per device (meta excluded)."""
    offloaded: Offloaded = NOTHING_OFFLOADED
    """Of ``param_bytes``, ``grad_bytes`` and ``optim_bytes`` (held anywhere), what the engine's offload
    policy holds in host memory (or on NVMe), off the rank's device."""

    @property
    def on_device(self) -> OnDevice:
        """The holdings on the rank's own device: what a GPU's memory is compared with."""
        o = self.offloaded
        return OnDevice(
            params=self.param_bytes - o.params if self.holdings is not None else None,
            grads=None if self.grad_bytes is None else self.grad_bytes - o.grads,
            optimizer=None if self.optim_bytes is None else self.optim_bytes - o.optimizer,
        )

    @property
    def hello(self) -> Hello | None:
        return self.state.hello

    @property
    def memory(self) -> Memory | None:
        return self.state.memory

    @property
    def oom(self) -> Oom | None:
        return self.state.oom

    @property
    def exit(self) -> Exit | None:
        return self.state.exit

    @property
    def holdings(self) -> Shards | None:
        """The best snapshot there is: after the engine, else the set-up one."""
        return self.shards or self.setup

    @property
    def allocator_peak(self) -> int | None:
        """The allocator's peak, else its highest reading; None on CPU (no allocator to ask)."""
        values = [
            v
            for m in (self.state.peak_memory, self.state.memory)
            if m is not None
            for v in (m.peak, m.allocated)
            if v is not None
        ]
        if self.oom is not None:
            values += [v for v in (self.oom.allocated, self.oom.peak) if v is not None]
        return max(values) if values else None

    # -- what fills the memory, by kind ---------------------------------------------------

    @property
    def memory_now(self) -> MemorySplit | None:
        """What fills the rank's memory by kind: at the OOM when it ran out, else the latest split."""
        if self.oom is not None and self.oom.memory is not None:
            return self.oom.memory
        return self.state.split

    @property
    def memory_peak(self) -> MemorySplit | None:
        """What filled the rank's memory at its peak: of the splits at a peak (the samples' latest,
        the OOM's), the one of the highest peak; on a tie the later (the OOM's)."""
        found = [s for s in (self.state.peak_split, self.oom.peak_split if self.oom else None) if s is not None]
        best = max(reversed(found), key=total_of) if found else None
        peak = self.allocator_peak
        if best is not None and best.allocated is not None and peak and best.allocated < PEAK_SPLIT_NEAR * peak:
            return None  # a split far below the allocator's peak is not the peak's: say nothing rather
        return best

    @property
    def cache_bytes(self) -> int | None:
        """The allocator's cache: reserved minus allocated, as ``held`` reads them (CUDA only)."""
        allocated, reserved, _ = held(self.state)
        if reserved is None or allocated is None:
            return None
        return max(0, reserved - allocated)

    @property
    def outside_pytorch_bytes(self) -> int | None:
        """Device memory the process holds outside PyTorch's allocator: NVML's count for the process
        minus reserved (CUDA context, NCCL and cuBLAS workspaces), in the latest sample that has
        that count; None where NVML gave none."""
        m = self.state.process_sample
        if m is None or m.process_used is None or m.reserved is None:
            return None
        return max(0, m.process_used - m.reserved)


def held(rs: RankState) -> tuple[int | None, int | None, int | None]:
    """Allocated, reserved and peak bytes: the latest sample's, or the OOM's if it came later or ended the rank.

    The allocator is sampled a few times a second; the OOM reports what the rank
    held at the moment it failed, which is the figure the bar must end on (full).
    A sample taken while a rank the OOM ended was unwinding says only what was freed.
    A rank that caught its OOM and went on shows its latest sample.
    """
    m, oom = rs.memory, rs.oom
    allocated, reserved, peak = (m.allocated, m.reserved, m.peak) if m else (None, None, None)
    ended_by_it = rs.exit is not None and rs.exit.status == "oom"
    if oom is not None and oom.allocated is not None and (m is None or oom.t >= m.t or ended_by_it):
        allocated = oom.allocated
        reserved = oom.reserved if oom.reserved is not None else reserved
        peak = max(p for p in (peak, oom.reserved, oom.allocated) if p is not None)
    return allocated, reserved, peak


def rank_facts(rs: RankState, run: RunStatus | None) -> RankFacts:
    latest = rs.shards
    engine_shards = latest if latest is not None and rs.engine_wrapped else None
    held = rs.holdings if engine_shards is not None else rs.setup_holdings
    return RankFacts(
        rank=rs.rank,
        host=rs.host,
        device=rs.device,
        pid=rs.pid,
        status=rank_status(rs, run),
        state=rs,
        shards=engine_shards,
        setup=rs.setup_shards,
        param_bytes=held.param_bytes if held is not None else 0,
        grad_bytes=held.grad_bytes if held is not None else None,
        optim_bytes=held.optim_bytes if held is not None else None,
        by_device=held.by_device if held is not None else MappingProxyType({}),
        offloaded=held.offloaded if held is not None else NOTHING_OFFLOADED,
    )
