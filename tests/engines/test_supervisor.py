"""The run's processes under real faults: a frozen rank, a rank killed by SIGKILL, the supervisor killed by
SIGKILL, a user who types ``--read-only`` before the command.  Real ``ddp-baseline`` runs on CPU processes."""

from __future__ import annotations

import os
import pty
import select
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from shardtop.config import resolve
from shardtop.launch import create_run, resolve_devices, start, stop
from shardtop.read.whole_run import read_run
from shardtop.rundir.event_files import read_all
from shardtop.rundir.events import Step
from shardtop.rundir.run_config import RunConfig
from shardtop.rundir.run_directory import RunDirectory, list_runs
from shardtop.rundir.run_meta import RunMeta
from tests.support.cli import ROOT, shardtop
from tests.support.terminal import hangup_ends_it
from tests.support.waiting import wait_until

pytestmark = pytest.mark.timeout(300)

MAX_STEPS = 100_000
"""Far longer than any test waits (a step takes about 20 ms on 2 cores); the tests end the run."""


def stepping(run: RunDirectory, ranks: int = 2) -> bool:
    events, _ = read_all(run.events_dir)
    return len({e.rank for e in events if isinstance(e, Step)}) == ranks


def alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def run_pids(run: RunDirectory) -> tuple[int, list[int]]:
    meta = run.read_meta()
    assert meta.pid is not None
    return meta.pid, [r.pid for r in meta.rank_pids]


def test_start_leaves_no_child_and_the_record_tells_a_kill_from_a_stop(tmp_path: Path) -> None:
    """Rank 0 hangs (SIGSTOP), rank 1 is killed by SIGKILL (as the kernel's OOM killer would):
    the supervisor stops rank 0 after the grace period, and exit.json says who did what."""
    config = resolve_devices(resolve("ddp-baseline", [("max_steps", str(MAX_STEPS))]), lambda: 0)
    run = create_run(tmp_path, RunConfig.of(config), ["test"])
    children_before = {p.pid for p in psutil.Process().children(recursive=True)}
    supervisor = start(run)
    try:
        assert {p.pid for p in psutil.Process().children(recursive=True)} == children_before, (
            "start() left a process for the caller to reap"
        )
        proc = psutil.Process(supervisor.pid)
        assert proc.ppid() != os.getpid()
        assert os.getpgid(supervisor.pid) == supervisor.pgid == supervisor.pid, "it leads its own group"
        assert os.getsid(supervisor.pid) == supervisor.pid, "and its own session: no terminal to lose"
        meta = run.read_meta()
        assert (meta.pid, meta.pgid) == (supervisor.pid, supervisor.pgid)
        assert meta.pid_started == pytest.approx(proc.create_time(), abs=0.01)
        wait_until(lambda: stepping(run), 120, "both ranks to train")
        _, (rank0, rank1) = run_pids(run)
        os.kill(rank0, signal.SIGSTOP)
        os.kill(rank1, signal.SIGKILL)
        wait_until(lambda: run.read_exit() is not None, 60, "the supervisor's exit record")
    finally:
        if run.status().state == "running":
            stop(run, grace=2.0, out=lambda _line: None)
    record = run.read_exit()
    assert record is not None
    assert record.reason == "rank 1 failed" and record.signal == signal.SIGKILL
    by_rank = {r.rank: r for r in record.ranks}
    assert (by_rank[1].signal, by_rank[1].stopped) == (signal.SIGKILL, False), "killed from outside"
    assert (by_rank[0].signal, by_rank[0].stopped) == (signal.SIGKILL, True), "stopped by shardtop"
    assert record.peers_stopped is not None
    assert record.peers_stopped.after_rank == 1 and record.peers_stopped.killed
    assert run.status().describe() == "failed (SIGKILL)"
    told = {r.rank: r.status for r in read_run(run).ranks}  # what every view shows beside each rank
    assert (told[1].state, told[1].detail) == ("killed", "SIGKILL"), "the killed rank is marked"
    assert (told[0].state, told[0].detail) == ("interrupted", "stopped after rank 1 failed"), "not an error of its own"
    wait_until(lambda: not alive(supervisor.pid), 10, "the supervisor to leave")


def test_the_run_outlives_the_terminal_that_launched_it(tmp_path: Path) -> None:
    """The terminal hangs up (SSH dropped): the headless launcher gets SIGHUP and dies; training goes on."""
    runs_dir = tmp_path / "runs"
    launcher = subprocess.Popen(
        [sys.executable, "-m", "shardtop", "launch", "ddp-baseline", "--headless", f"max_steps={MAX_STEPS}"],
        env={**os.environ, "SHARDTOP_RUNS_DIR": str(runs_dir), "CUDA_VISIBLE_DEVICES": ""},
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=ROOT, preexec_fn=hangup_ends_it,
    )
    try:
        wait_until(lambda: list_runs(runs_dir) and stepping(list_runs(runs_dir)[0]), 120, "the run to train")
        (run,) = list_runs(runs_dir)
        launcher.send_signal(signal.SIGHUP)
        assert launcher.wait(timeout=30) == -signal.SIGHUP
        steps_then = last_step(run)
        wait_until(lambda: last_step(run) > steps_then + 5, 60, "training to go on")
        assert run.status().state == "running" and run.read_exit() is None
        stopped = shardtop("stop", run.id, "--grace", "20", runs_dir=runs_dir)
        assert stopped.returncode == 0, stopped.stderr
    finally:
        launcher.kill()
        launcher.wait()
        for leftover in list_runs(runs_dir):
            stop(leftover, grace=2.0, out=lambda _line: None)
    record = run.read_exit()
    assert record is not None and record.reason == "stopped" and run.status().describe() == "stopped (SIGTERM)"
    assert [r.rank for r in record.ranks] == [0, 1]


def last_step(run: RunDirectory) -> int:
    events, _ = read_all(run.events_dir)
    return max((e.step for e in events if isinstance(e, Step) and e.rank == 0), default=0)


@pytest.fixture(scope="module")
def live_run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[RunDirectory, subprocess.Popen[str]]]:
    """A headless launch of a long ``ddp-baseline`` run, training."""
    runs_dir = tmp_path_factory.mktemp("live") / "runs"
    launcher = subprocess.Popen(
        [sys.executable, "-m", "shardtop", "launch", "ddp-baseline", "--headless", f"max_steps={MAX_STEPS}"],
        env={**os.environ, "SHARDTOP_RUNS_DIR": str(runs_dir), "CUDA_VISIBLE_DEVICES": ""},
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT,
    )
    wait_until(lambda: list_runs(runs_dir) and stepping(list_runs(runs_dir)[0]), 120, "the run to train")
    (run,) = list_runs(runs_dir)
    yield run, launcher
    if run.status().state == "running":
        stop(run, grace=2.0, out=lambda _line: None)
    launcher.kill()
    launcher.wait()


def screen_of(args: list[str], runs_dir: Path, keys: list[bytes], settle: float = 2.0) -> str:
    """Run ``shardtop ARGS`` in a real terminal (a pty, 120×40), type ``keys``, quit; what it drew."""
    pid, fd = pty.fork()
    if pid == 0:  # the child: becomes shardtop
        env = {**os.environ, "SHARDTOP_RUNS_DIR": str(runs_dir), "TERM": "xterm-256color", "COLUMNS": "120",
               "LINES": "40"}
        os.execve(sys.executable, [sys.executable, "-m", "shardtop", *args], env)
    import fcntl
    import struct
    import termios

    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 120, 0, 0))
    seen = b""

    def read_for(seconds: float) -> None:
        nonlocal seen
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            ready, _, _ = select.select([fd], [], [], 0.1)
            if ready:
                try:
                    seen += os.read(fd, 65536)
                except OSError:
                    return

    try:
        deadline = time.monotonic() + 60
        while b"Shard tree" not in seen and time.monotonic() < deadline:
            read_for(0.5)
        assert b"Shard tree" in seen, "the run view did not open"
        read_for(settle)
        for key in keys:
            os.write(fd, key)
            read_for(settle)
        os.write(fd, b"q")
        read_for(1.0)
    finally:
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        os.waitpid(pid, 0)
        os.close(fd)
    return seen.decode(errors="replace")


def test_read_only_before_the_command_cannot_stop_the_run(live_run: tuple[RunDirectory, subprocess.Popen[str]]) -> None:
    run, _ = live_run
    runs_dir = run.path.parent
    watching = screen_of(["attach", run.id], runs_dir, keys=[])
    assert "Stop run" in watching, "without --read-only the run view offers k Stop run"
    read_only = screen_of(["--read-only", "attach", run.id], runs_dir, keys=[b"k", b"y"])
    assert "Stop run" not in read_only
    assert run.status().state == "running", "k, y under --read-only stopped the run"
    refused = shardtop("--read-only", "stop", run.id, runs_dir=runs_dir)
    assert refused.returncode == 2 and "--read-only forbids stopping" in refused.stderr
    assert run.status().state == "running"


def test_supervisor_killed_with_sigkill_takes_its_ranks_along(
    live_run: tuple[RunDirectory, subprocess.Popen[str]],
) -> None:
    run, launcher = live_run
    supervisor, ranks = run_pids(run)
    assert all(alive(p) for p in (supervisor, *ranks))
    os.kill(supervisor, signal.SIGKILL)
    wait_until(lambda: not any(alive(p) for p in ranks), 10, "the ranks to die with their supervisor")
    out, _ = launcher.communicate(timeout=60)
    assert launcher.returncode == 1, out
    assert "lost" in out.splitlines()[-1], out
    assert run.read_exit() is None, "nobody wrote a record the supervisor did not write"
    assert run.status().state == "lost"
    listed = shardtop("runs", runs_dir=run.path.parent).stdout
    assert f"{run.id}  lost" in listed, listed


def test_a_supervisor_that_fails_records_why(tmp_path: Path) -> None:
    """A damaged run.json (no world size): the supervisor fails before any rank, and says so in exit.json."""
    damaged = RunMeta(preset="ddp-baseline", config=RunConfig(preset="ddp-baseline"))
    run = RunDirectory.create(tmp_path, "ddp-baseline", damaged)
    supervisor = start(run)
    wait_until(lambda: run.read_exit() is not None, 60, "the exit record")
    record = run.read_exit()
    assert record is not None and record.code == 1
    missing = f"{run.meta_path} gives no world_size: the number of ranks to start"
    assert record.reason == f"the supervisor failed: ConfigMissing: {missing}"
    assert run.status().state == "failed"
    assert "ConfigMissing" in run.runner_log.read_text()
    wait_until(lambda: not alive(supervisor.pid), 10, "the supervisor to leave")
