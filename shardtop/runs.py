"""Run directories: one per run, created 0700, found again by id, with a status.

Layout of a run directory::

    run.json          id, preset, resolved config, command, pids, host, user, start time
    events/rank-N.jsonl   one append-only event file per rank
    logs/rank-N.log   each rank's stdout and stderr
    runner.log        the rank supervisor's own output
    exit.json         how the run ended, every rank's exit, and whether shardtop stopped
                      the other ranks after one failed (``run_status`` has its fields)

No torch here: the TUI and the CLI read runs without importing it.
"""

from __future__ import annotations

import getpass
import json
import os
import secrets
import socket
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from shardtop.run_status import ExitStatus, PeersStopped, RankExit, RunStatus

RUNS_DIR_ENV = "SHARDTOP_RUNS_DIR"
RUN_DIR_ENV = "SHARDTOP_RUN_DIR"


class RunError(Exception):
    """A problem with a run directory the user can act on (exit code 2)."""


def default_runs_root() -> Path:
    """The user's state directory (``$XDG_STATE_HOME/shardtop/runs``)."""
    base = os.environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")
    return Path(base) / "shardtop" / "runs"


def runs_root(override: str | os.PathLike[str] | None = None) -> Path:
    """``--runs-dir`` beats ``$SHARDTOP_RUNS_DIR`` beats the user's state directory."""
    if override:
        return Path(override).expanduser()
    env = os.environ.get(RUNS_DIR_ENV)
    return Path(env).expanduser() if env else default_runs_root()


def check_owned(path: Path) -> None:
    """Refuse a directory someone else owns: we neither write into nor signal from it."""
    try:
        st = path.stat()
    except FileNotFoundError:
        return
    except OSError as e:
        raise RunError(_unusable(path, e)) from None
    if st.st_uid != os.getuid():
        try:
            import pwd

            owner = pwd.getpwuid(st.st_uid).pw_name
        except (KeyError, ImportError):
            owner = str(st.st_uid)
        raise RunError(
            f"{path} belongs to user {owner!r}, not to you ({getpass.getuser()!r}).\n"
            f"Use a runs directory of your own: --runs-dir DIR or {RUNS_DIR_ENV}=DIR."
        )


def _unusable(path: Path, error: OSError) -> str:
    """Why ``path`` cannot hold runs, in words, and what to do instead."""
    import errno

    why = {
        errno.ENOTDIR: "part of that path is a file, not a directory",
        errno.EROFS: "it is on a read-only file system",
        errno.EACCES: "permission denied",
        errno.EPERM: "permission denied",
        errno.ENOSPC: "the disk is full",
        errno.EDQUOT: "the disk quota is exhausted",
        errno.ENAMETOOLONG: "the path is too long",
    }.get(error.errno or 0, error.strerror or str(error))
    return f"cannot use {path} for runs: {why}.\nChoose another directory with --runs-dir DIR or {RUNS_DIR_ENV}=DIR."


def ensure_root(root: Path) -> Path:
    """Create the runs root (0700) if needed and make sure it is ours and writable."""
    check_owned(root)
    try:
        root.mkdir(mode=0o700, parents=True, exist_ok=True)
    except FileExistsError:
        raise RunError(f"{root} is not a directory; choose another with --runs-dir DIR.") from None
    except OSError as e:
        raise RunError(_unusable(root, e)) from None
    if not root.is_dir():
        raise RunError(f"{root} is not a directory; choose another with --runs-dir DIR.")
    return root


def new_run_id(preset: str, now: float | None = None) -> str:
    """Sorts by start time and names the preset: ``20261129-142233-fsdp2-mlp-3fa1``."""
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(now or time.time()))
    return f"{stamp}-{preset}-{secrets.token_hex(2)}"


class RunDirectory:
    """One run on disk."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)

    def __repr__(self) -> str:
        return f"RunDirectory({str(self.path)!r})"

    @property
    def id(self) -> str:
        return self.path.name

    @property
    def events_dir(self) -> Path:
        return self.path / "events"

    @property
    def logs_dir(self) -> Path:
        return self.path / "logs"

    @property
    def meta_path(self) -> Path:
        return self.path / "run.json"

    @property
    def exit_path(self) -> Path:
        return self.path / "exit.json"

    @property
    def runner_log(self) -> Path:
        return self.path / "runner.log"

    def rank_log(self, rank: int) -> Path:
        return self.logs_dir / f"rank-{rank}.log"

    @classmethod
    def create(cls, root: Path, preset: str, meta: dict[str, Any]) -> RunDirectory:
        """A new, empty run directory (0700) with its ``run.json``; a RunError if the root cannot hold it."""
        ensure_root(root)
        try:
            return cls._create(root, preset, meta)
        except RunError:
            raise
        except OSError as e:
            raise RunError(_unusable(root, e)) from None

    @classmethod
    def _create(cls, root: Path, preset: str, meta: dict[str, Any]) -> RunDirectory:
        for _ in range(10):
            path = root / new_run_id(preset)
            try:
                path.mkdir(mode=0o700)
                break
            except FileExistsError:
                continue
        else:  # pragma: no cover - ten collisions of a random suffix within one second
            raise RunError(f"could not create a new run directory under {root}")
        os.chmod(path, 0o700)
        run = cls(path)
        run.events_dir.mkdir(mode=0o700)
        run.logs_dir.mkdir(mode=0o700)
        base = {
            "id": run.id,
            "preset": preset,
            "created": time.time(),
            "host": socket.gethostname(),
            "user": getpass.getuser(),
        }
        run.write_meta({**base, **meta})
        return run

    def read_meta(self) -> dict[str, Any]:
        try:
            return json.loads(self.meta_path.read_text())
        except (OSError, ValueError):
            return {}

    def write_meta(self, meta: dict[str, Any]) -> None:
        _write_json_atomic(self.meta_path, meta)

    def update_meta(self, **fields: Any) -> None:
        self.write_meta({**self.read_meta(), **fields})

    def read_exit(self) -> ExitStatus | None:
        try:
            data = json.loads(self.exit_path.read_text())
        except (OSError, ValueError):
            return None
        return ExitStatus.from_json(data)

    def write_exit(
        self,
        code: int | None,
        signal: int | None = None,
        reason: str = "",
        ranks: tuple[RankExit, ...] = (),
        peers_stopped: PeersStopped | None = None,
    ) -> bool:
        """Record how the run ended; the first record wins (atomically). True if this one did."""
        record = {
            "code": code,
            "signal": signal,
            "ended": time.time(),
            "reason": reason,
            "ranks": [asdict(r) for r in ranks],
            "peers_stopped": asdict(peers_stopped) if peers_stopped is not None else None,
        }
        return _write_json_once(self.exit_path, record)

    def is_alive(self) -> bool:
        """Is a process this run started still there (same pid *and* start time)?"""
        return any(is_running(pid, started) for pid, started in self.processes())

    def register_rank(self, rank: int) -> None:
        """A script's rank says it is part of the run, so ``runs`` sees it running and ``stop`` finds it.

        Only for runs no supervisor of ours started; each rank writes its own small
        file, so there is no read-modify-write race on ``run.json``.
        """
        if not self.read_meta().get("external"):
            return
        pid = os.getpid()
        entry = {"rank": rank, "pid": pid, "started": process_start_time(pid)}
        (self.path / f".rank-{rank}.pid.json").write_text(json.dumps(entry))

    def processes(self) -> list[tuple[int, float | None]]:
        """(pid, start time) of the supervisor and of every rank that registered itself."""
        procs = _run_processes(self.read_meta())
        for path in sorted(self.path.glob(".rank-*.pid.json")):
            try:
                entry = json.loads(path.read_text())
                procs.append((int(entry["pid"]), entry.get("started")))
            except (OSError, ValueError, KeyError, TypeError):
                continue
        return procs

    def status(self) -> RunStatus:
        exit_status = self.read_exit()
        if exit_status is None:
            if self.is_alive():
                return RunStatus("running")
            return RunStatus("lost")
        if exit_status.reason == "stopped":
            return RunStatus("stopped", exit_status)
        if exit_status.code == 0 and not exit_status.signal:
            return RunStatus("finished", exit_status)
        return RunStatus("failed", exit_status)


def _run_processes(meta: dict[str, Any]) -> list[tuple[int, float | None]]:
    procs = []
    if meta.get("pid"):
        procs.append((int(meta["pid"]), meta.get("pid_started")))
    for entry in meta.get("rank_pids", []):
        procs.append((int(entry["pid"]), entry.get("started")))
    return procs


def process_start_time(pid: int) -> float | None:
    import psutil

    try:
        return psutil.Process(pid).create_time()
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return None


def is_running(pid: int, started: float | None) -> bool:
    """Is this still the process we recorded: alive, not a zombie, same start time (no pid reuse)?"""
    import psutil

    try:
        proc = psutil.Process(pid)
        if proc.status() == psutil.STATUS_ZOMBIE:
            return False
        actual = proc.create_time()
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return False
    return started is None or abs(actual - float(started)) < 1.0


def _write_json_atomic(path: Path, data: dict[str, Any]) -> None:
    tmp = _write_tmp(path, data)
    os.replace(tmp, path)


def _write_json_once(path: Path, data: dict[str, Any]) -> bool:
    """Create ``path`` with ``data`` unless it exists: two writers never both win."""
    if path.exists():
        return False
    tmp = _write_tmp(path, data)
    try:
        os.link(tmp, path)
        return True
    except FileExistsError:
        return False
    finally:
        os.unlink(tmp)


def _write_tmp(path: Path, data: dict[str, Any]) -> Path:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(data, f, indent=2, sort_keys=True, default=str)
        f.write("\n")
    return tmp


def list_runs(root: Path) -> list[RunDirectory]:
    """Every run under the root, oldest first (ids sort by start time)."""
    if not root.is_dir():
        return []
    runs = [RunDirectory(p) for p in root.iterdir() if p.is_dir() and (p / "run.json").exists()]
    return sorted(runs, key=lambda r: (r.read_meta().get("created", 0.0), r.id))


def find_run(root: Path, ref: str | None) -> RunDirectory:
    """A run by id, any unique part of it, a path, or ``None``/``latest`` for the newest."""
    if ref and os.sep in ref or (ref and Path(ref).is_dir() and (Path(ref) / "run.json").exists()):
        path = Path(ref).expanduser()
        if not (path / "run.json").exists():
            raise RunError(f"{path} is not a shardtop run directory (it has no run.json).")
        check_owned(path)
        return RunDirectory(path)
    runs = list_runs(root)
    if not runs:
        raise RunError(f"no runs under {root}. Start one with: shardtop launch preset=fsdp2-mlp")
    if ref in (None, "", "latest"):
        run = runs[-1]
    else:
        exact = [r for r in runs if r.id == ref]
        matches = exact or [r for r in runs if ref in r.id]
        if not matches:
            raise RunError(f"no run {ref!r} under {root}. `shardtop runs` lists them.")
        if len(matches) > 1:
            names = "\n  ".join(r.id for r in matches[-10:])
            raise RunError(f"{ref!r} matches {len(matches)} runs; be more precise:\n  {names}")
        run = matches[0]
    check_owned(run.path)
    return run
