"""Follow one run directory and hand out immutable snapshots of it.  It only reads.

``RunFeed.poll()`` has its ``RunFollower`` fold the events appended since the
last call into the read model (``RunModel``) and (no more often than
``refresh`` seconds, except for what the user must see at once: a rank coming
up, the tree, an OOM, an exit) returns a ``RunSnapshot``.  The
shard model and the findings are rebuilt here, in the worker thread, and only
when the tree, the shards or an OOM changed.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from shardtop.diagnose import Finding, diagnose, rule_failed
from shardtop.read.follower import RunFollower
from shardtop.read.run_model import RunModel
from shardtop.read.run_state import RunState
from shardtop.read.shard_model import ShardModel
from shardtop.rundir.run_directory import RunDirectory
from shardtop.rundir.run_meta import RunMeta
from shardtop.rundir.run_status import RunStatus
from shardtop.tui.watch.log_tail import LogLine, LogTail
from shardtop.tui.watch.rank_activity import RankActivity, rank_activity

Diagnosis = Callable[[RunModel], Sequence[Finding]]
"""``diagnose``, or a stand-in where a test needs the diagnosis to fail."""

DIAGNOSE_EVERY = 5.0
"""Seconds between diagnoses while only memory and steps change (structure changes diagnose at once) ..."""
DIAGNOSE_RANKS = 128
"""... for up to this many ranks; a diagnosis costs in proportion to the ranks, so a run of 512 is
diagnosed every 20 s while only its memory moves (0.5 % of a core every 5 s, measured at 512 ranks)."""
MAX_LOG_LINES = 1000
"""New log lines handed over per snapshot; more than this and the oldest are dropped."""
STATUS_EVERY_ENDED = 5.0
"""Seconds between status reads of a run that has ended (it may be restarted, or its record completed)."""
EVENT_TICK = 0.25
"""How often new events are looked for; what is urgent (an OOM) is shown at once."""
FILES_OPENED_PER_S = 512
"""Event files opened per second at most.  Every poll opens every rank's file anew (on shared storage
that is what shows other hosts' appends), so a run of 512 ranks is looked at once a second (at a 1 s
refresh), one of 128 ranks or fewer every ``EVENT_TICK``: an OOM on a large run takes up to a second
longer to show, and the file server is asked 512 opens a second rather than 2 048."""


@dataclass(frozen=True)
class RunSnapshot:
    """Everything the run view shows, at one moment."""

    run: RunDirectory
    model: RunModel
    tree: ShardModel | None
    findings: tuple[Finding, ...]
    new_log: tuple[LogLine, ...]
    """Log lines since the previous snapshot."""
    serial: int
    """1 for the first snapshot of a feed, then counting up."""
    activity: tuple[RankActivity, ...] = ()
    """While there is no tree: what each rank is doing (its phase, its last log line)."""

    @property
    def state(self) -> RunState:
        return self.model.state

    @property
    def status(self) -> RunStatus:
        assert self.model.status is not None
        return self.model.status

    @property
    def meta(self) -> RunMeta:
        return self.model.meta

    @property
    def live(self) -> bool:
        return self.status.state == "running"


def model_key(state: RunState) -> tuple[Any, ...]:
    """Changes when the shard model must be rebuilt: a new tree or new shards."""
    return (id(state.tree), tuple((r.rank, id(r.shards)) for r in state.rank_list()))


class RunFeed:
    """Reads a run directory incrementally; only ``poll`` touches the disk."""

    def __init__(
        self,
        run: RunDirectory,
        refresh: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
        findings: Diagnosis = diagnose,
        follower: RunFollower | None = None,
        now: Callable[[], float] = time.time,
    ) -> None:
        """``follower``: the run's follower where a first frame has read the head of its events already;
        ``now``: the time of day (how long a starting rank has been building)."""
        self.run = run
        self.refresh = refresh
        self.clock = clock
        self.now = now
        self.findings_of = findings
        self.follower = follower if follower is not None else RunFollower(run)
        self.logs = LogTail(run)
        self._serial = 0
        self._last_post = float("-inf")
        self._status_at = float("-inf")
        self._structure: int | None = None
        self._model_key: tuple[Any, ...] | None = None
        self._diagnosed_at = float("-inf")
        self._tree: ShardModel | None = None
        self._findings: tuple[Finding, ...] = ()
        self._posted: RunModel | None = None
        self._pending_log: list[LogLine] = []
        self._activity: tuple[RankActivity, ...] = ()

    @property
    def every(self) -> float:
        """Seconds between polls: ``EVENT_TICK``, longer for a run of many ranks (each poll opens every file)."""
        return min(self.refresh, max(EVENT_TICK, self.follower.file_count / FILES_OPENED_PER_S))

    def poll(self, force: bool = False) -> RunSnapshot | None:
        """A snapshot if something changed and it is time to show it; else None."""
        now = self.clock()
        self.follower.read_events()
        structure = self.follower.structure  # ranks coming up, the tree, shards, an OOM, an exit: shown at once
        urgent = force or structure != self._structure or self._serial == 0
        due = now - self._last_post >= self.refresh
        if not (urgent or due):
            return None
        status_changed = self._check_status(now)
        self._pending_log.extend(self.logs.read_new_lines())
        model = self.follower.model()
        state = model.state
        activity = rank_activity(self.run, model, self.now()) if state.tree is None else ()
        changed = model is not self._posted or bool(self._pending_log) or activity != self._activity
        if not changed:
            return None
        held = model_key(state)
        if held != self._model_key:  # an OOM alone must not wait for a 100k-module rebuild
            self._model_key = held
            self._tree = ShardModel.of(state)
        every = DIAGNOSE_EVERY * max(1.0, len(state.ranks) / DIAGNOSE_RANKS)
        if structure != self._structure or status_changed or now - self._diagnosed_at >= every:
            self._structure = structure
            self._diagnosed_at = now
            findings = self._diagnose(model)
            if findings != self._findings:  # same findings, same object: the screen re-renders nothing
                self._findings = findings
        self._serial += 1
        self._last_post = now
        self._posted = model
        self._activity = activity
        log = tuple(self._pending_log[-MAX_LOG_LINES:])
        self._pending_log.clear()
        return RunSnapshot(
            run=self.run, model=model, tree=self._tree, findings=self._findings, new_log=log, serial=self._serial,
            activity=activity,
        )

    def _check_status(self, now: float) -> bool:
        """Read the status; a run that has ended only every ``STATUS_EVERY_ENDED`` seconds."""
        status = self.follower.status
        if status is not None and status.state != "running" and now - self._status_at < STATUS_EVERY_ENDED:
            return False
        self._status_at = now
        return self.follower.read_status()

    def _diagnose(self, model: RunModel) -> tuple[Finding, ...]:
        try:
            return tuple(self.findings_of(model))
        except Exception as e:  # a broken diagnosis must not take the view down
            return (rule_failed("diagnosis", e),)
