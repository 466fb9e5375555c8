"""The supervisor of one host's command: started detached, it outlives the terminal.

It runs the command in a process group of its own and passes a stop on to
that group (``shardtop stop`` signals the supervisor: on this run's first
host through the supervisor's group, on any other host by its pid), with
the probe's bootstrap on its ``PYTHONPATH``, its output in
``logs/command-HOST.log``; it touches its record every few seconds (how other
hosts see it alive) and, when the command ends, writes the command's exit code
into the record and returns it.  ``exit.json`` is written by the first host
whose command failed, or by the last one to finish; a supervisor that was
signalled leaves it to ``shardtop stop`` (or, without one, the records tell an
interrupted run).  No torch here.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

from shardtop.gpus import gpu_count
from shardtop.inject import command_env
from shardtop.inject.rehearsal_env import Rehearsed, first_gpu
from shardtop.own_job.mem_cap import cap_environment
from shardtop.rundir.cluster import HEARTBEAT_S, host_name
from shardtop.rundir.liveness import process_start_time
from shardtop.rundir.run_directory import RunDirectory
from shardtop.rundir.run_members import (
    end_supervisor,
    supervised_end,
    supervisor_record,
    touch,
    write_supervisor,
)
from shardtop.rundir.run_status import RankExit
from shardtop.runner.supervisor import exit_code_of, free_port

STOP_GRACE_S = 8.0
"""After passing a stop on, how long the command gets before SIGKILL (``shardtop stop`` waits 10 s by default)."""


def command_log(run: RunDirectory) -> Path:
    return run.logs_dir / f"command-{host_name()}.log"


def say(text: str) -> None:
    print(f"shardtop: {text}", flush=True)


def supervise(run_dir: Path, command: list[str], cwd: str) -> int:
    run = RunDirectory(run_dir)
    record = supervisor_record(run.path)
    pid = os.getpid()
    write_supervisor(record, pid=pid, started=process_start_time(pid), command=command, cwd=cwd)
    signals: list[int] = []

    def on_signal(signum: int, _frame: object) -> None:
        signals.append(signum)

    for handled in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(handled, on_signal)  # a handler, not SIG_IGN: the command must not inherit an ignored signal
    first: tuple[int, int | None] | None = None
    stopped_by: int | None = None
    rehearsed: list[RankExit] = []
    for rank, env in _environments(run):
        try:
            proc = subprocess.Popen(command, cwd=cwd, env=env, stdin=subprocess.DEVNULL, start_new_session=True)
        except OSError as e:
            say(f"could not start {command[0]!r}: {e.strerror or e}")
            end_supervisor(record, 127, None)
            run.write_exit(127, reason=f"command could not start on {host_name()}", ending="failed")
            return 127
        say(f"started {subprocess.list2cmdline(command)} (pid {proc.pid}) on {host_name()}")
        code, sig, stop_signal = _follow(proc, record, signals)
        say(f"command exited with {code}" + (f" (signal {sig})" if sig else ""))
        if first is None or first[0] == 0:
            first = (code, sig)
        if rank is not None:  # a rehearsed rank is this one command: its exit is the rank's
            rehearsed.append(RankExit(rank=rank, code=code, signal=sig, stopped=stop_signal is not None))
        if stop_signal is not None:
            stopped_by = stop_signal if code != 0 else None
            break
    assert first is not None
    code, sig = first
    end_supervisor(record, code, sig or stopped_by)
    if stopped_by is None:
        if code != 0:
            run.write_exit(code, signal=sig, reason=f"command failed on {host_name()}", ranks=tuple(rehearsed),
                           ending="failed")
        else:
            end = supervised_end(run.members())
            if end is not None:
                run.write_exit(
                    end.code, signal=end.signal, reason=end.reason, ranks=tuple(rehearsed), ending=end.ending
                )
    return code


def _environments(run: RunDirectory) -> Iterator[tuple[int | None, dict[str, str]]]:
    """The command's environment for each time it runs: once, or once per rehearsed rank, in turn."""
    base = command_env(os.environ, run.path)
    config = run.read_meta().config
    rehearsal = config.rehearsal
    if config.gpu_mem_limit is not None:
        on_gpu = rehearsal.on != "CPU" if rehearsal is not None else _sees_gpus(base)
        why = cap_environment(base, config.gpu_mem_limit, on_gpu=on_gpu)
        say(f"each rank capped at {config.gpu_mem_limit} bytes of {'GPU' if on_gpu else 'CPU'} memory"
            + (f"; {why}" if why else ""))
    if rehearsal is None:
        yield None, base
        return
    for rank in rehearsal.ranks:
        env = dict(base)
        env.update(Rehearsed(rank, rehearsal.world_size).environment(free_port()))
        if "CUDA_VISIBLE_DEVICES" in env or rehearsal.on != "CPU":
            env["CUDA_VISIBLE_DEVICES"] = first_gpu(env)
        say(f"rehearsing rank {rank} of {rehearsal.world_size}")
        yield rank, env


def _sees_gpus(env: dict[str, str]) -> bool:
    return env.get("CUDA_VISIBLE_DEVICES") != "" and gpu_count() > 0


def _follow(proc: subprocess.Popen[bytes], record: Path, signals: list[int]) -> tuple[int, int | None, int | None]:
    """Wait for the command, passing a stop on and touching the record; (code, signal, the stop's signal)."""
    stop = _Stop(proc)
    while proc.poll() is None:
        stop.follow(signals)
        try:
            proc.wait(timeout=0.5 if stop.asked_at else HEARTBEAT_S)
        except subprocess.TimeoutExpired:
            touch(record)
    code, sig = exit_code_of(proc.returncode)
    return code, sig, stop.signal


class _Stop:
    """``shardtop stop`` (or anyone) signalled the supervisor: pass it on to the command's process group, once;
    SIGKILL the group if it is still there ``STOP_GRACE_S`` later (before ``stop``'s own grace runs out)."""

    def __init__(self, proc: subprocess.Popen[bytes]) -> None:
        self.proc = proc
        self.signal: int | None = None
        self.asked_at = 0.0
        self.killed = False

    def follow(self, signals: list[int]) -> None:
        asked = next((s for s in signals if s != signal.SIGHUP), None)  # SIGHUP: a terminal went away, not a stop
        if asked is not None and self.signal is None:
            self.signal, self.asked_at = asked, time.monotonic()
            say(f"passing signal {asked} on to the command")
            self._signal_group(asked)
        elif self.signal is not None and not self.killed and time.monotonic() - self.asked_at > STOP_GRACE_S:
            self.killed = True
            say(f"the command is still running {STOP_GRACE_S:.0f}s later: SIGKILL")
            self._signal_group(signal.SIGKILL)

    def _signal_group(self, signum: int) -> None:
        try:
            os.killpg(self.proc.pid, signum)
        except ProcessLookupError:
            pass


def main(argv: list[str] | None = None) -> int:
    """``python -m shardtop.own_job.supervisor RUN_DIR [--cwd DIR] -- CMD ARGS``."""
    argv = sys.argv[1:] if argv is None else argv
    split = argv.index("--") if "--" in argv else len(argv)
    parser = argparse.ArgumentParser(prog="python -m shardtop.own_job.supervisor")
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--cwd", default=os.getcwd())
    args = parser.parse_args(argv[:split])
    return supervise(args.run_dir, argv[split + 1:], args.cwd)


if __name__ == "__main__":
    sys.exit(main())
