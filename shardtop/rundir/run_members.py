"""The processes that work on a run, host by host, and whether they are still there.

Every process that joins a run leaves a record of its own, so no two hosts
ever rewrite the same file on shared storage::

    .rank-N.pid.json          a rank of a run that no supervisor of ours started
    supervisors/HOST-PID.json a ``shardtop run`` supervisor: host, pid, command, and,
                              once its command ended, the command's exit code

A process on this host is alive while its pid runs with the recorded start
time.  One on another host cannot be asked: it counts as alive while its files
keep changing (a rank writes a memory sample every half second, a supervisor
touches its record every few seconds).  No torch here.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from shardtop.rundir.cluster import STALE_AFTER_S, host_name
from shardtop.rundir.json_files import write_json_atomic
from shardtop.rundir.liveness import is_running
from shardtop.rundir.run_status import ExitReason

SUPERVISORS_DIR = "supervisors"
RANK_RECORD_GLOB = ".rank-*.pid.json"


@dataclass(frozen=True)
class Member:
    """One process of a run, as its record says."""

    kind: str
    """``supervisor`` (of ``shardtop run``) or ``rank`` (a rank that registered itself)."""
    pid: int
    host: str = ""
    """Empty in a record that names no host: this host."""
    started: float | None = None
    rank: int | None = None
    code: int | None = None
    """A supervisor's command's exit code, once it ended."""
    signal: int | None = None
    ended: float | None = None
    heartbeat: float | None = None
    """When its files last changed (for processes on other hosts)."""

    @property
    def is_local(self) -> bool:
        return not self.host or self.host == host_name()

    def alive(self, now: float | None = None) -> bool:
        if self.ended is not None:
            return False
        if self.is_local:
            return is_running(self.pid, self.started)
        if self.heartbeat is None:
            return False
        return (now if now is not None else time.time()) - self.heartbeat < STALE_AFTER_S


def _mtime(path: Path) -> float | None:
    try:
        return path.stat().st_mtime
    except OSError:
        return None


def supervisor_record(run_path: Path, pid: int | None = None) -> Path:
    """This host's record of the supervisor ``pid`` (this process by default)."""
    return run_path / SUPERVISORS_DIR / f"{host_name()}-{pid or os.getpid()}.json"


def write_supervisor(record: Path, *, pid: int, started: float | None, command: list[str], cwd: str) -> None:
    record.parent.mkdir(mode=0o700, exist_ok=True)
    write_json_atomic(
        record,
        {"host": host_name(), "pid": pid, "started": started, "command": command, "cwd": cwd, "joined": time.time()},
    )


def end_supervisor(record: Path, code: int, signal: int | None) -> None:
    """The command ended: its exit code goes into the supervisor's record."""
    data = _read(record) or {}
    write_json_atomic(record, {**data, "code": code, "signal": signal, "ended": time.time()})


def touch(record: Path) -> None:
    try:
        os.utime(record)
    except OSError:
        pass


def _read(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def read_members(run_path: Path) -> list[Member]:
    """Every supervisor and self-registered rank of the run, with its heartbeat."""
    return list(iter_members(run_path))


def iter_members(run_path: Path) -> Iterator[Member]:
    """``read_members`` one record at a time: "is one still there?" stops at the first (64 hosts, 64 records)."""
    for path in sorted((run_path / SUPERVISORS_DIR).glob("*.json")):
        supervisor = _member(path, "supervisor")
        if supervisor is not None:
            yield supervisor
    for path in sorted(run_path.glob(RANK_RECORD_GLOB)):
        rank = _member(path, "rank")
        if rank is not None:
            events = _mtime(run_path / "events" / f"rank-{rank.rank}.jsonl")
            yield replace(rank, heartbeat=events or rank.heartbeat)


def _member(path: Path, kind: str) -> Member | None:
    data = _read(path)
    if data is None:
        return None
    try:
        return Member(
            kind=kind,
            pid=int(data["pid"]),
            host=str(data.get("host") or ""),
            started=data.get("started"),
            rank=int(data["rank"]) if kind == "rank" else None,
            code=data.get("code"),
            signal=data.get("signal"),
            ended=data.get("ended"),
            heartbeat=_mtime(path),
        )
    except (KeyError, TypeError, ValueError):
        return None


@dataclass(frozen=True)
class SupervisedEnd:
    """How a run of ``shardtop run`` ended once every host's command did."""

    code: int
    signal: int | None
    ended: float
    reason: str
    """The ending in words (``command failed on node-2``)."""
    ending: ExitReason


def supervised_end(members: list[Member]) -> SupervisedEnd | None:
    """The end of the run when every supervisor's command has ended; None while one has not.

    The first command that failed decides (the others usually fail because of
    it); if none failed, the run finished.
    """
    supervisors = [m for m in members if m.kind == "supervisor"]
    if not supervisors or any(m.ended is None or m.code is None for m in supervisors):
        return None
    failed = sorted((m for m in supervisors if m.code), key=lambda m: m.ended or 0.0)
    last = max(m.ended or 0.0 for m in supervisors)
    if failed:
        first = failed[0]
        words = f"command failed on {first.host}"
        return SupervisedEnd(first.code or 1, first.signal, first.ended or last, words, "failed")
    hosts = len({m.host for m in supervisors})
    return SupervisedEnd(0, None, last, "finished" if hosts == 1 else f"finished on {hosts} hosts", "finished")
