"""Follow one run directory and hand out immutable snapshots of it.

``RunFeed.poll()`` reads the events appended since the last call, folds them
into a ``RunState``, and (no more often than ``refresh`` seconds, except for
what the user must see at once: a rank coming up, the tree, an OOM, an exit)
returns a ``RunSnapshot``.  The shard model and the findings are rebuilt here,
in the worker thread, and only when the tree, the shards or an OOM changed.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from shardtop.diagnose import Finding, diagnose
from shardtop.events import EventReader
from shardtop.run_state import RunState, RunStateBuilder
from shardtop.runs import RunDirectory, RunStatus, process_start_time
from shardtop.shard_model import ShardModel
from shardtop.tui.watch.log_tail import LogTail

Diagnosis = Callable[[RunState], Sequence[Finding]]
"""``diagnose``, or a stand-in where a test needs the diagnosis to fail."""

DIAGNOSE_EVERY = 5.0
"""Seconds between diagnoses while only memory and steps change (structure changes diagnose at once)."""
MAX_LOG_LINES = 1000
"""New log lines handed over per snapshot; more than this and the oldest are dropped."""


@dataclass(frozen=True)
class RunSnapshot:
    """Everything the run view shows, at one moment."""

    run: RunDirectory
    meta: Mapping[str, Any]
    state: RunState
    status: RunStatus
    model: ShardModel | None
    findings: tuple[Finding, ...]
    new_log: tuple[str, ...]
    """Log lines since the previous snapshot."""
    serial: int
    """1 for the first snapshot of a feed, then counting up."""

    @property
    def preset(self) -> str:
        return str(self.meta.get("preset", "")) or "(own script)"

    @property
    def live(self) -> bool:
        return self.status.state == "running"


def model_key(state: RunState) -> tuple[Any, ...]:
    """Changes when the shard model must be rebuilt: a new tree or new shards."""
    return (id(state.tree), tuple((r.rank, id(r.shards)) for r in sorted(state.ranks.values(), key=lambda r: r.rank)))


def structure_key(state: RunState) -> tuple[Any, ...]:
    """Changes with what must be shown at once: ranks coming up, the tree, shards, an OOM, an exit."""
    ranks = tuple(
        (r.rank, id(r.hello), id(r.shards), id(r.setup_shards), id(r.oom), id(r.exit))
        for r in sorted(state.ranks.values(), key=lambda r: r.rank)
    )
    return (id(state.tree), ranks)


def reap(pid: int | None, started: float | None = None) -> tuple[int, int | None] | None:
    """Collect our own ended child (the run we launched), so it does not linger as a zombie.

    ``started``: the start time the run recorded for it, so that a recycled pid
    that happens to be another child of ours is left alone.  Returns (exit
    code, signal) once it ended; None while it runs or if it is not our child.
    """
    if not pid:
        return None
    if started is not None:
        actual = process_start_time(int(pid))
        if actual is None or abs(actual - float(started)) >= 1.0:
            return None
    try:
        done, status = os.waitpid(int(pid), os.WNOHANG)
    except (ChildProcessError, OSError):
        return None
    if done == 0:
        return None
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        return 128 + sig, sig
    return os.waitstatus_to_exitcode(status), None


class RunFeed:
    """Reads a run directory incrementally; only ``poll`` touches the disk."""

    def __init__(
        self,
        run: RunDirectory,
        refresh: float = 1.0,
        read_only: bool = False,
        clock: Callable[[], float] = time.monotonic,
        findings: Diagnosis = diagnose,
    ) -> None:
        self.run = run
        self.refresh = refresh
        self.read_only = read_only
        self.clock = clock
        self.findings_of = findings
        self.reader = EventReader(run.events_dir)
        self.builder = RunStateBuilder()
        self.logs = LogTail(run)
        self._serial = 0
        self._last_post = float("-inf")
        self._status_at = float("-inf")
        self._status: RunStatus | None = None
        self._meta: Mapping[str, Any] = MappingProxyType({})
        self._structure: tuple[Any, ...] | None = None
        self._model_key: tuple[Any, ...] | None = None
        self._diagnosed_at = float("-inf")
        self._model: ShardModel | None = None
        self._findings: tuple[Finding, ...] = ()
        self._posted_state: RunState | None = None
        self._pending_log: list[str] = []

    def poll(self, force: bool = False) -> RunSnapshot | None:
        """A snapshot if something changed and it is time to show it; else None."""
        now = self.clock()
        events = self.reader.read_new()
        if events:
            self.builder.apply(events)
        self.builder.note_skipped(self.reader.skipped_total)
        state = self.builder.snapshot()
        structure = structure_key(state)
        urgent = force or structure != self._structure or self._serial == 0
        due = now - self._last_post >= self.refresh
        status_changed = False
        if urgent or due:
            status_changed = self._check_status(now)
            self._pending_log.extend(self.logs.read_new())
        changed = state is not self._posted_state or status_changed or bool(self._pending_log)
        if not changed or not (urgent or due or status_changed):
            return None
        if model_key(state) != self._model_key:  # an OOM alone must not wait for a 100k-module rebuild
            self._model_key = model_key(state)
            self._model = self._build_model(state)
        if structure != self._structure or now - self._diagnosed_at >= DIAGNOSE_EVERY:
            self._structure = structure
            self._diagnosed_at = now
            findings = self._diagnose(state)
            if findings != self._findings:  # same findings, same object: the screen re-renders nothing
                self._findings = findings
        self._serial += 1
        self._last_post = now
        self._posted_state = state
        log = tuple(self._pending_log[-MAX_LOG_LINES:])
        self._pending_log.clear()
        assert self._status is not None
        return RunSnapshot(
            run=self.run,
            meta=self._meta,
            state=state,
            status=self._status,
            model=self._model,
            findings=self._findings,
            new_log=log,
            serial=self._serial,
        )

    def _check_status(self, now: float) -> bool:
        if self._status is not None and self._status.state != "running" and now - self._status_at < 5.0:
            return False
        self._status_at = now
        meta = self.run.read_meta()
        ended = reap(meta.get("pid"), meta.get("pid_started"))
        if ended is not None and not self.read_only:
            code, sig = ended
            self.run.write_exit(code, signal=sig, reason="supervisor ended")
        status = self.run.status()
        changed = status != self._status
        self._status = status
        if changed:
            self._meta = MappingProxyType(meta)
        return changed

    @staticmethod
    def _build_model(state: RunState) -> ShardModel | None:
        if state.tree is None:
            return None
        shards = {r.rank: r.shards for r in state.ranks.values() if r.shards is not None}
        return ShardModel.build(state.tree, shards, paths=state.paths)

    def _diagnose(self, state: RunState) -> tuple[Finding, ...]:
        try:
            return tuple(self.findings_of(state))
        except Exception as e:  # a broken rule must not take the view down
            return (
                Finding(
                    code="diagnose-failed",
                    title="The diagnosis failed",
                    detail=f"{type(e).__name__}: {e}",
                    fix="Report this as a shardtop bug, with `shardtop report RUN --format json`.",
                    severity="info",
                ),
            )
