"""The run directory contract: made once by whoever comes first, joined by the rest, read by every command.

Real processes race to make the run; a rank's own script (``SHARDTOP_RUN_DIR``
and the probe, as the README shows) makes a run ``report``, ``runs`` and
``attach`` read; each host's supervisor keeps its own record, and the run's
status follows from them: ``finished``, ``failed`` or ``interrupted``, never
``lost`` for a job that ended.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import signal
import socket
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from shardtop.rundir.cluster import STALE_AFTER_S
from shardtop.rundir.event_files import read_all
from shardtop.rundir.events import Hello, Step
from shardtop.rundir.json_files import write_json_atomic
from shardtop.rundir.liveness import process_start_time
from shardtop.rundir.run_directory import RunDirectory
from shardtop.rundir.run_members import end_supervisor, supervisor_record, write_supervisor
from shardtop.rundir.run_meta import RunMeta
from tests.support.cli import ROOT
from tests.support.own_job_runs import cli, user_env
from tests.support.terminal import hangup_ends_it


def _make_or_join(path: str, start: float, out: multiprocessing.Queue) -> None:  # type: ignore[type-arg]
    while time.time() < start:
        time.sleep(0.001)
    run, created = RunDirectory.create_or_join(Path(path), RunMeta(preset=f"maker-{os.getpid()}"))
    out.put((created, run.read_meta().preset))


def test_processes_racing_for_a_new_directory_make_one_run(tmp_path: Path) -> None:
    target = tmp_path / "shared" / "run"
    ctx = multiprocessing.get_context("fork")
    out = ctx.Queue()
    start = time.time() + 0.5
    procs = [ctx.Process(target=_make_or_join, args=(str(target), start, out)) for _ in range(8)]
    for p in procs:
        p.start()
    results = [out.get(timeout=30) for _ in procs]
    for p in procs:
        p.join(timeout=30)
    assert sum(created for created, _ in results) == 1
    winner = next(preset for created, preset in results if created)
    assert {preset for _, preset in results} == {winner}  # everyone reads the winner's run.json, whole
    assert stat.S_IMODE(target.stat().st_mode) == 0o700
    assert sorted(p.name for p in target.iterdir()) == ["events", "logs", "run.json"]  # no temporary left


def test_a_script_with_the_probe_makes_its_run_in_a_new_directory(tmp_path: Path) -> None:
    """``SHARDTOP_RUN_DIR=/some/new/dir torchrun … train.py``, the script attaching as the README shows."""
    target = tmp_path / "some" / "new" / "dir"
    done = subprocess.run(
        ["torchrun", "--standalone", "--nproc_per_node", "2", str(ROOT / "tests" / "user_scripts" / "attach_raw.py")],
        env=user_env(SHARDTOP_RUN_DIR=str(target)), capture_output=True, text=True, timeout=300, cwd=tmp_path,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    run = RunDirectory(target)
    meta = run.read_meta()
    assert meta.external is True and meta.id == "dir" and meta.config.program == "attach_raw"
    events, _ = read_all(run.events_dir)
    assert sorted(e.rank for e in events if isinstance(e, Hello)) == [0, 1]
    assert sorted(e.step for e in events if isinstance(e, Step)) == [1, 1, 2, 2]
    assert run.status().state == "finished"
    report = cli("report", str(target), runs_dir=tmp_path / "runs")
    assert report.returncode == 0 and "2 rank(s)" in report.stdout, report.stderr
    listing = cli("runs", "--runs-dir", str(target.parent), runs_dir=tmp_path / "runs")
    assert "dir " in listing.stdout and "finished" in listing.stdout


# -- status from the supervisors' records ------------------------------------------------------


def _record(run: RunDirectory, host: str, pid: int, *, code: int | None = None, sig: int | None = None,
            age: float = 0.0) -> Path:
    """A supervisor's record as that host would write it (another host's, on shared storage)."""
    path = run.path / "supervisors" / f"{host}-{pid}.json"
    path.parent.mkdir(exist_ok=True)
    data = {"host": host, "pid": pid, "started": 1.0, "command": ["torchrun"], "cwd": "/"}
    if code is not None:
        data.update(code=code, signal=sig, ended=time.time() - age)
    write_json_atomic(path, data)
    os.utime(path, (time.time() - age, time.time() - age))
    return path


def test_a_run_of_two_hosts_is_running_until_both_commands_ended(tmp_path: Path) -> None:
    run, _ = RunDirectory.create_or_join(tmp_path / "run", RunMeta(own_job=True))
    _record(run, "node-a", 101, code=0)
    _record(run, "node-b", 202)  # still touching its record
    assert run.status().state == "running"
    _record(run, "node-b", 202, age=STALE_AFTER_S + 5)  # silent for over a minute: that host is gone
    assert run.status().state == "lost"
    _record(run, "node-b", 202, code=0)
    status = run.status()
    assert (status.state, status.exit.reason if status.exit else None) == ("finished", "finished on 2 hosts")


def test_the_first_failing_host_decides_and_a_signal_reads_interrupted(tmp_path: Path) -> None:
    run, _ = RunDirectory.create_or_join(tmp_path / "run", RunMeta(own_job=True))
    _record(run, "node-a", 101, code=1, age=10)
    _record(run, "node-b", 202, code=143, sig=signal.SIGTERM, age=5)
    assert run.status().describe() == "failed (exit 1)"
    other, _ = RunDirectory.create_or_join(tmp_path / "other", RunMeta(own_job=True))
    _record(other, "node-a", 101, code=143, sig=signal.SIGTERM)
    assert other.status().describe() == "interrupted (SIGTERM)"


def test_stop_never_signals_a_pid_another_host_recorded(tmp_path: Path) -> None:
    run, _ = RunDirectory.create_or_join(tmp_path / "run", RunMeta(external=True))
    me = os.getpid()
    entry = {"rank": 3, "pid": me, "started": process_start_time(me), "host": "another-node"}
    (run.path / ".rank-3.pid.json").write_text(json.dumps(entry))
    assert run.processes() == []  # that pid number is someone else's process here
    entry["host"] = socket.gethostname()
    (run.path / ".rank-3.pid.json").write_text(json.dumps(entry))
    assert run.processes() == [(me, entry["started"])]


def test_a_supervisor_record_of_this_host(tmp_path: Path) -> None:
    run, _ = RunDirectory.create_or_join(tmp_path / "run", RunMeta(own_job=True))
    record = supervisor_record(run.path)
    write_supervisor(record, pid=os.getpid(), started=process_start_time(os.getpid()), command=["x"], cwd="/")
    assert run.status().state == "running" and run.processes()[-1][0] == os.getpid()
    end_supervisor(record, 0, None)
    assert run.status().state == "finished"


# -- the command line ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "says"),
    [
        ((), "needs the command to run after --"),
        (("--", "no-such-program-here"), "'no-such-program-here': it is not on PATH"),
        (("--run-dir", "{tmp}/x", "--runs-dir", "{tmp}/y", "--", "true"), "not both"),
        (("--run-dir", "{tmp}/busy", "--", "true"), "is not empty (notes.txt) and holds no shardtop run"),
        (("--run-dir", "{tmp}/a-file", "--", "true"), "is a file"),
        (("--run-dir", "{tmp}/ended", "--", "true"), "holds a run that has already ended (finished)"),
    ],
)
def test_bad_command_lines_are_refused_and_nothing_is_made(tmp_path: Path, args: tuple[str, ...], says: str) -> None:
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "notes.txt").write_text("mine")
    (tmp_path / "a-file").write_text("mine")
    ended, _ = RunDirectory.create_or_join(tmp_path / "ended", RunMeta(own_job=True))
    ended.write_exit(0, reason="finished", ending="finished")
    before = sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*"))
    done = cli("run", "--headless", *(a.format(tmp=tmp_path) for a in args), runs_dir=tmp_path / "runs")
    assert done.returncode == 2 and says in done.stderr, done.stderr
    assert "Traceback" not in done.stderr
    assert sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*")) == before


def test_read_only_forbids_starting_a_command(tmp_path: Path) -> None:
    done = cli("--read-only", "run", "--", "true", runs_dir=tmp_path / "runs")
    assert done.returncode == 2 and "--read-only" in done.stderr
    assert not (tmp_path / "runs").exists()


def test_the_command_survives_its_terminal_and_stop_ends_it(tmp_path: Path) -> None:
    """The SSH connection drops: ``shardtop run`` dies, the command goes on; ``shardtop stop`` ends it."""
    runs_dir = tmp_path / "runs"
    marker = tmp_path / "still-running"
    script = f"import pathlib, time\nwhile True:\n    pathlib.Path({str(marker)!r}).touch(); time.sleep(0.1)\n"
    foreground = subprocess.Popen(
        [sys.executable, "-m", "shardtop", "run", "--headless", "--", sys.executable, "-c", script],
        env={**user_env(), "SHARDTOP_RUNS_DIR": str(runs_dir)}, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        cwd=ROOT, preexec_fn=hangup_ends_it,
    )
    try:
        deadline = time.time() + 60
        while not marker.exists() and time.time() < deadline:
            time.sleep(0.1)
        assert marker.exists(), "the command did not start"
        foreground.send_signal(signal.SIGHUP)  # what a dropped SSH connection does to the terminal's processes
        foreground.wait(timeout=30)
        (run,) = [RunDirectory(p) for p in runs_dir.iterdir()]
        supervisor = run.read_meta().pid
        assert os.getsid(supervisor) == supervisor  # a session of its own: no terminal to lose
        marker.unlink()
        time.sleep(0.5)
        assert marker.exists(), "the command stopped with its terminal"
        assert "running" in cli("runs", runs_dir=runs_dir).stdout
        stopped = cli("stop", run.id, "--grace", "10", runs_dir=runs_dir)
        assert stopped.returncode == 0, stopped.stderr
        assert run.status().state == "stopped"
        marker.unlink()
        time.sleep(0.5)
        assert not marker.exists(), "the command outlived shardtop stop"
    finally:
        foreground.kill()
