"""The rank supervisor: one process per run, leader of the run's process group.

It starts one rank process per device with the usual torch.distributed
environment (so Lightning sees externally created processes and does not
spawn its own), sends each rank's output to ``logs/rank-N.log``, and writes
``exit.json`` with every rank's exit.  When one rank fails, the others are
usually stuck in a collective waiting for it: after a short grace they are
stopped, so a failed run ends instead of hanging for NCCL/gloo's 30-minute
timeout, and the record says that shardtop stopped them.

Each rank is told by the kernel to die with its supervisor
(``PR_SET_PDEATHSIG``): a supervisor killed with SIGKILL leaves no rank behind
training with nobody to collect it.

No torch here: the supervisor stays small and starts fast.
"""

from __future__ import annotations

import ctypes
import os
import signal
import socket
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from shardtop.inject.rehearsal_env import Rehearsed, first_gpu
from shardtop.rundir.liveness import process_start_time
from shardtop.rundir.run_directory import RUN_DIR_ENV, RunDirectory
from shardtop.rundir.run_status import PeersStopped, RankExit

PEER_GRACE_S = 15.0
"""How long surviving ranks get to finish on their own after one rank failed."""
STOP_GRACE_S = 5.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


PR_SET_PDEATHSIG = 1
"""prctl(2): the signal a process gets when the thread that started it exits."""


@dataclass
class RankProcess:
    rank: int
    proc: subprocess.Popen[bytes]
    stopped: bool = False
    """This supervisor sent it a signal."""

    @property
    def code(self) -> int | None:
        return self.proc.poll()

    def exit(self) -> RankExit:
        code, sig = exit_code_of(self.proc.returncode)
        return RankExit(rank=self.rank, code=code, signal=sig, stopped=self.stopped)


def die_with_parent(parent: int) -> Callable[[], None] | None:
    """A ``preexec_fn`` that makes the child get SIGKILL when ``parent`` (this process) ends.

    It runs in the child between fork and exec.  If the parent already ended
    before the prctl took effect, the child would be orphaned and never get the
    signal: it checks its parent afterwards and leaves at once instead.  SIGKILL,
    not SIGTERM: a rank blocked in a collective cannot act on SIGTERM, and with
    its supervisor gone nobody would follow up.  None where prctl is missing.
    """
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):  # pragma: no cover - not Linux
        return None

    def preexec() -> None:
        prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != parent:
            os._exit(128 + signal.SIGKILL)

    return preexec


def rank_env(config: dict[str, Any], run: RunDirectory, rank: int, world_size: int, port: int) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        {
            RUN_DIR_ENV: str(run.path),
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
            "RANK": str(rank),
            "LOCAL_RANK": str(rank),
            "NODE_RANK": "0",
            "GROUP_RANK": "0",
            "WORLD_SIZE": str(world_size),
            "LOCAL_WORLD_SIZE": str(world_size),
            "PYTHONUNBUFFERED": "1",
            "TORCH_NCCL_ASYNC_ERROR_HANDLING": env.get("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1"),
        }
    )
    if config.get("rehearsal"):  # rank R of N as the only process of node R, on the first device
        env.update(Rehearsed(rank, world_size).environment(port))
        if config.get("accelerator") == "cuda":
            env["CUDA_VISIBLE_DEVICES"] = first_gpu(env)
    if config.get("accelerator") == "cpu":
        env["DS_ACCELERATOR"] = "cpu"
        env["CUDA_VISIBLE_DEVICES"] = ""
        cores = os.cpu_count() or 1
        sharing = 1 if config.get("rehearsal") else world_size  # rehearsed ranks run one at a time
        env.setdefault("OMP_NUM_THREADS", str(max(1, cores // max(1, sharing))))
    return env


def exit_code_of(code: int) -> tuple[int, int | None]:
    """(shell-style exit code, signal) of a Popen return code."""
    if code < 0:
        return 128 - code, -code
    return code, None


def supervise(run_dir: Path) -> int:
    """Run the ranks to the end and write ``exit.json``; returns the run's exit code.

    A failure of the supervisor itself is recorded too (code 1, the error as
    the reason); its ranks then die with it.
    """
    run = RunDirectory(run_dir)
    try:
        return _supervise(run)
    except Exception as e:
        traceback.print_exc()
        run.write_exit(1, reason=f"the supervisor failed: {type(e).__name__}: {e}")
        return 1


def _supervise(run: RunDirectory) -> int:
    meta = run.read_meta()
    if meta.get("pid") != os.getpid():  # started by hand, or the launcher died before recording us
        run.update_meta(pid=os.getpid(), pgid=os.getpgid(0), pid_started=process_start_time(os.getpid()))
    config = meta["config"]
    stopping: list[int] = []
    asked_at: list[float] = []

    def on_signal(signum: int, _frame: object) -> None:
        stopping.append(signum)
        asked_at.append(time.time())

    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, on_signal)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)

    exits: list[RankExit] = []
    first_failure: RankExit | None = None
    peers_stopped: PeersStopped | None = None
    for batch in rank_batches(config):
        ranks = _start(run, config, batch)
        failed, stopped = _watch(ranks, stopping)
        exits.extend(r.exit() for r in ranks)
        if first_failure is None and failed is not None:
            first_failure, peers_stopped = failed.exit(), stopped
        if stopping:
            break
    return _record(run, tuple(exits), stopping, first_failure, peers_stopped, asked_at[0] if asked_at else None)


def rank_batches(config: dict[str, Any]) -> list[list[int]]:
    """The ranks to start together: every rank of the run at once, or, for a rehearsal, each
    rehearsed rank alone, one after another (they share the one device)."""
    rehearsal = config.get("rehearsal")
    if rehearsal:
        return [[int(rank)] for rank in rehearsal["ranks"]]
    return [list(range(int(config["world_size"])))]


def _start(run: RunDirectory, config: dict[str, Any], batch: list[int]) -> list[RankProcess]:
    world_size = int(config["world_size"])
    port = free_port()
    preexec = die_with_parent(os.getpid())
    ranks: list[RankProcess] = []
    for rank in batch:
        log = open(run.rank_log(rank), "ab", buffering=0)
        proc = subprocess.Popen(
            [sys.executable, "-m", "shardtop.runner", str(run.path), "--rank", str(rank)],
            env=rank_env(config, run, rank, world_size, port),
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            preexec_fn=preexec,
        )
        log.close()
        ranks.append(RankProcess(rank, proc))
    run.update_meta(
        rank_pids=[
            {"rank": r.rank, "pid": r.proc.pid, "started": process_start_time(r.proc.pid)} for r in ranks
        ]
    )
    print(f"started {len(ranks)} rank(s): {', '.join(f'{r.rank} (pid {r.proc.pid})' for r in ranks)}", flush=True)
    return ranks


def _watch(ranks: list[RankProcess], stopping: list[int]) -> tuple[RankProcess | None, PeersStopped | None]:
    """Wait for ``ranks`` to end; stop the others a grace after one failed, or all of them on a signal.

    Returns the first rank that failed, and whether (and how) its peers were stopped.
    """
    first_failure: RankProcess | None = None
    failed_at = 0.0
    stop_sent_at = 0.0
    peers_stopped: PeersStopped | None = None
    while True:
        codes = [r.code for r in ranks]
        if all(c is not None for c in codes):
            break
        if first_failure is None:
            for r in ranks:
                if r.code not in (None, 0):
                    first_failure, failed_at = r, time.monotonic()
                    print(f"rank {r.rank} exited with {r.code}; giving the others {PEER_GRACE_S:.0f}s", flush=True)
                    break
        now = time.monotonic()
        if stopping and not stop_sent_at:
            _signal_all(ranks, signal.SIGTERM)
            stop_sent_at = now
        elif first_failure is not None and not stop_sent_at and now - failed_at > PEER_GRACE_S:
            print("stopping the remaining ranks", flush=True)
            _signal_all(ranks, signal.SIGTERM)
            stop_sent_at = now
            peers_stopped = PeersStopped(after_rank=first_failure.rank, at=time.time())
        overdue = stop_sent_at and now - stop_sent_at > STOP_GRACE_S
        if overdue and _signal_all(ranks, signal.SIGKILL) and peers_stopped is not None:
            peers_stopped = PeersStopped(peers_stopped.after_rank, peers_stopped.at, killed=True)
        time.sleep(0.1)
    if first_failure is None:
        first_failure = next((r for r in ranks if r.code != 0), None)
    return first_failure, peers_stopped


def _record(
    run: RunDirectory,
    exits: tuple[RankExit, ...],
    stopping: list[int],
    first_failure: RankExit | None,
    peers_stopped: PeersStopped | None,
    stop_requested: float | None = None,
) -> int:
    """Write ``exit.json`` for the run's ranks; returns the run's exit code."""
    if stopping:
        run.write_exit(128 + stopping[0], signal=stopping[0], reason="stopped", ranks=exits,
                       stop_requested=stop_requested)
        print(f"stopped by signal {stopping[0]}", flush=True)
        return 128 + stopping[0]
    if first_failure is None:
        run.write_exit(0, reason="finished", ranks=exits)
        print("all ranks finished", flush=True)
        return 0
    run.write_exit(
        first_failure.code, signal=first_failure.signal, reason=f"rank {first_failure.rank} failed", ranks=exits,
        peers_stopped=peers_stopped,
    )
    print(f"run failed: rank {first_failure.rank} exit {first_failure.code}", flush=True)
    return first_failure.code


def _signal_all(ranks: list[RankProcess], sig: int) -> bool:
    """Send ``sig`` to every rank still running; True if there was one."""
    sent = False
    for r in ranks:
        if r.code is None:
            try:
                r.proc.send_signal(sig)
                r.stopped = sent = True
            except ProcessLookupError:
                pass
    return sent
