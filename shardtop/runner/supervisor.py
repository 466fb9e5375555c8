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
from dataclasses import dataclass, field, replace
from pathlib import Path

from shardtop.inject.rehearsal_env import Rehearsed, first_gpu
from shardtop.rundir import run_meta
from shardtop.rundir.liveness import process_start_time
from shardtop.rundir.run_config import RunConfig
from shardtop.rundir.run_directory import RUN_DIR_ENV, RunDirectory
from shardtop.rundir.run_status import PeersStopped, RankExit
from shardtop.words import plural

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


def rank_env(config: RunConfig, run: RunDirectory, rank: int, world_size: int, port: int) -> dict[str, str]:
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
    if config.rehearsal is not None:  # rank R of N as the only process of node R, on the first device
        env.update(Rehearsed(rank, world_size).environment(port))
        if config.accelerator == "cuda":
            env["CUDA_VISIBLE_DEVICES"] = first_gpu(env)
    if config.accelerator == "cpu":
        env["DS_ACCELERATOR"] = "cpu"
        env["CUDA_VISIBLE_DEVICES"] = ""
        cores = os.cpu_count() or 1
        sharing = 1 if config.rehearsal is not None else world_size  # rehearsed ranks run one at a time
        env.setdefault("OMP_NUM_THREADS", str(max(1, cores // max(1, sharing))))
        if config.gpu_mem_limit is not None:
            from shardtop.runner.cpu_cap import preload
            from shardtop.runner.limits import CAP_FALLBACK_ENV

            env[CAP_FALLBACK_ENV] = preload(env)  # "" once preloaded: the rank arms it (limits.py)
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
        run.write_exit(1, reason=f"the supervisor failed: {type(e).__name__}: {e}", ending="failed")
        return 1


def _supervise(run: RunDirectory) -> int:
    _own(run)
    config = read_config(run)
    stop = StopRequest.install()
    return _record(run, _run_ranks(run, config, stop), stop)


def _own(run: RunDirectory) -> None:
    """Record this process as the run's supervisor where the launcher did not (started by hand, or
    the launcher died before recording it)."""
    if run.read_meta().pid != os.getpid():
        run.update_meta(pid=os.getpid(), pgid=os.getpgid(0), pid_started=process_start_time(os.getpid()))


class ConfigMissing(Exception):
    """``run.json`` does not say what to start."""


def read_config(run: RunDirectory) -> RunConfig:
    """The run's configuration, with the ranks to start; ``ConfigMissing`` where it names none."""
    config = run.read_meta().config
    if not config.world_size:
        raise ConfigMissing(f"{run.meta_path} gives no world_size: the number of ranks to start")
    return config


@dataclass
class StopRequest:
    """SIGTERM or SIGINT to the supervisor, noted by its handler: stop every rank, record ``stopped``."""

    signals: list[int] = field(default_factory=list)
    asked_at: list[float] = field(default_factory=list)

    @classmethod
    def install(cls) -> StopRequest:
        """Note SIGTERM and SIGINT from now on; ignore SIGHUP (a closed terminal leaves the run going)."""
        stop = cls()

        def on_signal(signum: int, _frame: object) -> None:
            stop.signals.append(signum)
            stop.asked_at.append(time.time())

        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, on_signal)
        signal.signal(signal.SIGHUP, signal.SIG_IGN)
        return stop

    @property
    def signal(self) -> int | None:
        """The first signal that asked for the stop; None while none did."""
        return self.signals[0] if self.signals else None

    @property
    def requested(self) -> float | None:
        """When the stop was asked for."""
        return self.asked_at[0] if self.asked_at else None


@dataclass(frozen=True)
class RanksEnded:
    """How the run's ranks ended, batch after batch."""

    exits: tuple[RankExit, ...] = ()
    first_failure: RankExit | None = None
    peers_stopped: PeersStopped | None = None

    def after(self, ranks: list[RankProcess], failed: RankProcess | None, stopped: PeersStopped | None) -> RanksEnded:
        """These, and then a batch of ``ranks`` that ended; the run's first failure stays the first."""
        exits = self.exits + tuple(r.exit() for r in ranks)
        if self.first_failure is not None or failed is None:
            return replace(self, exits=exits)
        return RanksEnded(exits, failed.exit(), stopped)


def _run_ranks(run: RunDirectory, config: RunConfig, stop: StopRequest) -> RanksEnded:
    """Start each batch of ranks and watch it to its end; no batch starts after a stop."""
    ended = RanksEnded()
    for batch in config.rank_batches:
        ranks = _start(run, config, batch)
        failed, peers_stopped = _watch(ranks, stop.signals)
        ended = ended.after(ranks, failed, peers_stopped)
        if stop.signal is not None:
            break
    return ended


def _start(run: RunDirectory, config: RunConfig, batch: list[int]) -> list[RankProcess]:
    port = free_port()
    preexec = die_with_parent(os.getpid())
    ranks: list[RankProcess] = []
    for rank in batch:
        log = open(run.rank_log(rank), "ab", buffering=0)
        proc = subprocess.Popen(
            [sys.executable, "-m", "shardtop.runner", str(run.path), "--rank", str(rank)],
            env=rank_env(config, run, rank, config.world_size, port),
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            preexec_fn=preexec,
        )
        log.close()
        ranks.append(RankProcess(rank, proc))
    run.update_meta(rank_pids=tuple(
        run_meta.RankProcess(rank=r.rank, pid=r.proc.pid, started=process_start_time(r.proc.pid)) for r in ranks
    ))
    started = ", ".join(f"{r.rank} (pid {r.proc.pid})" for r in ranks)
    print(f"started {plural(len(ranks), 'rank')}: {started}", flush=True)
    return ranks


def _watch(ranks: list[RankProcess], stopping: list[int]) -> tuple[RankProcess | None, PeersStopped | None]:
    """Wait for ``ranks`` to end; stop the others a grace after one failed, or all of them on a signal.

    Returns the first rank that failed, and whether (and how) its peers were stopped.
    """
    first_failure: RankProcess | None = None
    failed_at = 0.0
    stop_sent_at = 0.0
    peers_stopped: PeersStopped | None = None
    while any(r.code is None for r in ranks):
        if first_failure is None:
            first_failure = _failed(ranks)
            if first_failure is not None:
                failed_at = time.monotonic()
                print(f"rank {first_failure.rank} exited with {first_failure.code}; "
                      f"giving the others {PEER_GRACE_S:.0f}s", flush=True)
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


def _failed(ranks: list[RankProcess]) -> RankProcess | None:
    """The first rank, in rank order, that has ended with a failing code."""
    return next((r for r in ranks if r.code not in (None, 0)), None)


def _record(run: RunDirectory, ended: RanksEnded, stop: StopRequest) -> int:
    """Write ``exit.json`` for the run's ranks; returns the run's exit code."""
    if stop.signal is not None:
        code = 128 + stop.signal
        run.write_exit(code, signal=stop.signal, reason="stopped", ranks=ended.exits,
                       stop_requested=stop.requested, ending="stopped")
        print(f"stopped by signal {stop.signal}", flush=True)
        return code
    failure = ended.first_failure
    if failure is None:
        run.write_exit(0, reason="finished", ranks=ended.exits, ending="finished")
        print("all ranks finished", flush=True)
        return 0
    run.write_exit(
        failure.code, signal=failure.signal, reason=f"rank {failure.rank} failed", ranks=ended.exits,
        peers_stopped=ended.peers_stopped, ending="failed",
    )
    print(f"run failed: rank {failure.rank} exit {failure.code}", flush=True)
    return failure.code


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
