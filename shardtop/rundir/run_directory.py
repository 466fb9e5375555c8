"""Run directories: one per run, created 0700, found again by id, with a status.

Layout of a run directory::

    run.json          id, preset, resolved config, command, pids, host, user, start time
    events/rank-N.jsonl   one append-only event file per rank
    logs/rank-N.log   each rank's stdout and stderr
    runner.log        the rank supervisor's own output
    exit.json         how the run ended, every rank's exit, and whether shardtop stopped
                      the other ranks after one failed (``run_status`` has its fields)

A run of ``shardtop run`` also holds ``logs/command-HOST.log``, its
``bootstrap/`` and one record per host in ``supervisors/``; a run its ranks
made alone (``$SHARDTOP_RUN_DIR`` naming a new directory) holds one
``.rank-N.pid.json`` per rank (``run_members.py``).

No torch here: the TUI and the CLI read runs without importing it.
"""

from __future__ import annotations

import getpass
import json
import os
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import msgspec

from shardtop.rundir.cluster import SlurmIds, host_name
from shardtop.rundir.json_files import write_atomic, write_json_once, write_once
from shardtop.rundir.liveness import is_running, process_start_time
from shardtop.rundir.run_config import RunConfig
from shardtop.rundir.run_members import Member, iter_members, read_members, supervised_end
from shardtop.rundir.run_meta import RunMeta, decode, encode
from shardtop.rundir.run_status import ExitReason, PeersStopped, RankExit, RunExit, RunStatus, ended_state

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


def _unusable(
    path: Path, error: OSError, instead: str = f"Choose another directory with --runs-dir DIR or {RUNS_DIR_ENV}=DIR."
) -> str:
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
    return f"cannot use {path} for runs: {why}.\n{instead}"


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
    return f"{stamp}-{preset}-{os.urandom(2).hex()}"


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
    def create(cls, root: Path, name: str, meta: RunMeta) -> RunDirectory:
        """A new, empty run directory (0700) whose id says ``name``, with ``meta`` as its ``run.json`` (its id,
        host, user and start time filled in); a RunError if the root cannot hold it."""
        ensure_root(root)
        try:
            return cls._create(root, name, meta)
        except RunError:
            raise
        except OSError as e:
            raise RunError(_unusable(root, e)) from None

    @classmethod
    def _create(cls, root: Path, name: str, meta: RunMeta) -> RunDirectory:
        for _ in range(10):
            path = root / new_run_id(name)
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
        run.write_meta(msgspec.structs.replace(
            meta, id=run.id, created=time.time(), host=host_name(), user=getpass.getuser()
        ))
        return run

    @classmethod
    def create_or_join(cls, path: Path, meta: RunMeta) -> tuple[RunDirectory, bool]:
        """The run in ``path``: made here with ``meta`` if nobody made it yet, else joined.

        Any number of processes, on any number of hosts sharing the directory, may
        call this at once: ``run.json`` is written whole under a private name and
        hard-linked into place, which succeeds for exactly one of them (the link
        fails with ``FileExistsError`` for the others, on local disks and NFS
        alike).  Returns the run and whether this call made it.
        """
        path = Path(path).expanduser()
        instead = f"Name another directory with --run-dir DIR or {RUN_DIR_ENV}=DIR."
        check_owned(path)
        try:
            path.mkdir(mode=0o700, parents=True, exist_ok=True)
        except OSError as e:
            raise RunError(_unusable(path, e, instead)) from None
        if not path.is_dir():
            raise RunError(f"{path} is not a directory. {instead}")
        run = cls(path)
        created = False
        if not run.meta_path.exists():
            slurm = SlurmIds.from_env()
            made = msgspec.structs.replace(
                meta, id=run.id, created=time.time(), host=host_name(), user=getpass.getuser(),
                slurm=slurm if slurm else None,
            )
            created = write_once(run.meta_path, encode(made))
            if created:
                os.chmod(path, 0o700)
        for sub in (run.events_dir, run.logs_dir):
            sub.mkdir(mode=0o700, exist_ok=True)
        return run, created

    def read_meta(self) -> RunMeta:
        """What the run is; the empty record where ``run.json`` cannot be read or is not a JSON object."""
        try:
            data = self.meta_path.read_bytes()
        except OSError:
            return RunMeta()
        return decode(data)

    def write_meta(self, meta: RunMeta) -> None:
        write_atomic(self.meta_path, encode(meta))

    def update_meta(self, **fields: Any) -> None:
        """``run.json`` with these fields of ``RunMeta`` changed (``pid=...``), written whole."""
        self.write_meta(msgspec.structs.replace(self.read_meta(), **fields))

    def read_exit(self) -> RunExit | None:
        try:
            data = json.loads(self.exit_path.read_text())
        except (OSError, ValueError):
            return None
        return RunExit.from_json(data)

    def write_exit(
        self,
        code: int | None,
        signal: int | None = None,
        reason: str = "",
        ranks: tuple[RankExit, ...] = (),
        peers_stopped: PeersStopped | None = None,
        stop_requested: float | None = None,
        *,
        ending: ExitReason,
    ) -> bool:
        """Record how the run ended (``ending``, and in words ``reason``); the first record wins
        (atomically). True if this one did."""
        record = {
            "code": code,
            "signal": signal,
            "ended": time.time(),
            "ending": ending,
            "reason": reason,
            "ranks": [asdict(r) for r in ranks],
            "peers_stopped": asdict(peers_stopped) if peers_stopped is not None else None,
            "stop_requested": stop_requested,
        }
        return write_json_once(self.exit_path, record)

    def members(self) -> list[Member]:
        """The supervisors of ``shardtop run`` and the self-registered ranks, on every host."""
        return read_members(self.path)

    def is_alive(self) -> bool:
        """Is a process of this run still there?

        On this host: same pid *and* start time.  On another host (a run on shared
        storage): its files changed within the last minute.
        """
        meta = self.read_meta()
        if _here(meta) and any(is_running(p, t) for p, t in meta.processes):
            return True
        return any(m.alive() for m in iter_members(self.path))  # stops at the first one alive

    def register_rank(self, rank: int) -> None:
        """A rank joins the run, making it first if ``$SHARDTOP_RUN_DIR`` named a new directory.

        The first rank to get here creates ``run.json`` (marked ``external``: no
        supervisor of ours will write ``exit.json``, the ranks will), the others
        join it, without races (``create_or_join``).  In such a run each rank then
        writes its own small record, so ``runs`` sees it running and ``stop`` finds
        it, with no read-modify-write race on ``run.json``.
        """
        import sys

        if not self.meta_path.exists():
            name = _program_name(sys.argv)
            world_size = os.environ.get("WORLD_SIZE", "1")
            config = RunConfig(program=name, world_size=int(world_size) if world_size.isdigit() else 1)
            self.create_or_join(self.path, RunMeta(config=config, command=tuple(sys.argv), external=True))
        if not self.read_meta().external:
            return
        pid = os.getpid()
        entry = {"rank": rank, "pid": pid, "started": process_start_time(pid), "host": host_name()}
        (self.path / f".rank-{rank}.pid.json").write_text(json.dumps(entry))

    def processes(self) -> list[tuple[int, float | None]]:
        """(pid, start time) of this run's processes *on this host*: the only ones we may signal."""
        meta = self.read_meta()
        procs = meta.processes if _here(meta) else []
        procs.extend((m.pid, m.started) for m in self.members() if m.is_local and m.ended is None)
        return procs

    def status(self) -> RunStatus:
        record = self.read_exit()
        if record is None:
            if self.is_alive():
                return RunStatus("running")
            end = supervised_end(self.members())  # every host's `shardtop run` recorded its command's end
            if end is None:
                return RunStatus("lost")
            record = RunExit(end.code, end.signal, end.ended, end.reason, end.ending)
        return RunStatus(ended_state(record), record)


def _here(meta: RunMeta) -> bool:
    """Whether the run was made on this host (a run that does not say counts as this host's): only then
    do the pids it recorded mean this host's processes."""
    return meta.host in ("", host_name())


def _program_name(argv: list[str]) -> str:
    """``train`` for ``python train.py``; ``script`` where there is no script file."""
    name = Path(argv[0]).stem if argv and argv[0] else ""
    return name if name not in ("", "-c", "-m", "__main__") else "script"


def list_runs(root: Path) -> list[RunDirectory]:
    """Every run under the root, oldest first (ids sort by start time)."""
    if not root.is_dir():
        return []
    runs = [RunDirectory(p) for p in root.iterdir() if p.is_dir() and (p / "run.json").exists()]
    return sorted(runs, key=lambda r: (r.read_meta().created or 0.0, r.id))


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
