"""Faults from outside and from inside the probe: none loses a run's record, none stops the training.

Every test meets a real fault: a full filesystem (a small tmpfs), a CPU memory
cap (``RLIMIT_DATA``, what ``gpu_mem_limit`` sets on CPU), a SIGTERM, a
module the shard reader cannot read.  Scripts run as their own processes
(``reliability_scripts.py``), presets through ``shardtop launch``.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from shardtop.report import render_report
from shardtop.rundir.event_files import read_all
from shardtop.rundir.events import Exit, Fault, Memory, Oom, Step
from shardtop.rundir.run_directory import RunDirectory, list_runs
from shardtop.rundir.run_status import RunExit
from tests.support.cli import ROOT, shardtop
from tests.support.waiting import wait_until

KiB = 1 << 10


# -- helpers ------------------------------------------------------------------------------


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 1 MiB tmpfs: a filesystem that really fills up."""
    mount_point = tmp_path / "disk"
    mount_point.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m,mode=0700", "tmpfs", str(mount_point)],
                          capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (needs root and mount rights): {done.stderr.strip()}")
    try:
        yield mount_point
    finally:
        subprocess.run(["umount", "-l", str(mount_point)], check=False)


def fill(disk: Path, leave: int) -> None:
    """Fill ``disk`` until only ``leave`` bytes are free."""
    stats = os.statvfs(disk)
    free = stats.f_bavail * stats.f_frsize
    with open(disk / "filler", "wb") as f:
        f.write(b"\0" * max(0, free - leave))


def run_script(mode: str, runs_dir: Path, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tests.support.reliability_scripts", mode, *args],
        env=script_env(runs_dir), capture_output=True, text=True, timeout=timeout, cwd=ROOT,
    )


def script_env(runs_dir: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("SHARDTOP_RUN_DIR", "RANK", "LOCAL_RANK", "WORLD_SIZE")}
    return {**env, "SHARDTOP_RUNS_DIR": str(runs_dir), "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1"}


def the_run(runs_dir: Path) -> RunDirectory:
    (run,) = list_runs(runs_dir)
    return run


def leftovers(root: Path) -> list[Path]:
    return [p for p in root.rglob("*") if p.name.endswith(".tmp")]


# -- a full disk ----------------------------------------------------------------------------


def test_a_disk_that_fills_up_stops_the_events_not_the_training(small_disk: Path) -> None:
    runs_dir = small_disk / "runs"
    runs_dir.mkdir()
    fill(small_disk, leave=160 * KiB)
    done = run_script("disk-fills", runs_dir, "400")
    assert done.returncode == 0, done.stderr[-3000:]
    assert "trained 400 steps" in done.stdout
    run = the_run(runs_dir)
    events, skipped = read_all(run.events_dir)
    assert sum(skipped.values()) == 0, skipped  # no torn line where the disk ran out
    steps = [e.step for e in events if isinstance(e, Step)]
    assert 0 < len(steps) < 400  # the disk did fill up during the run
    (stopped,) = [e for e in events if isinstance(e, Fault) and e.part == "events"]
    assert "No space left on device" in stopped.error
    exits = [e for e in events if isinstance(e, Exit)]
    assert [(e.status, e.code) for e in exits] == [("ok", 0)]
    assert done.stderr.count("shardtop: the probe's event file failed on rank 0") == 1
    assert leftovers(small_disk) == []


def test_the_oom_and_exit_records_fit_on_a_full_disk(small_disk: Path) -> None:
    from shardtop.rundir.event_files import EventWriter, event_file

    reasons: list[str] = []
    writer = EventWriter(event_file(small_disk / "events", 0), 0, host="box", on_stop=reasons.append)
    fill(small_disk, leave=0)
    written = 0
    while writer.write(Step(step=written + 1)):
        written += 1
    assert writer.stopped is not None and reasons == [writer.stopped]
    assert not writer.write(Step(step=written + 1))  # ordinary events stay stopped
    assert writer.write(Fault(part="events", error=writer.stopped))
    assert writer.write(Oom(phase="forward", module="net.3", message="x" * 8000, traceback=["frame"] * 40))
    assert writer.write(Exit(code=1, status="oom", error="MemoryError"))
    writer.close()
    events, skipped = read_all(small_disk / "events")
    assert sum(skipped.values()) == 0
    assert [type(e).__name__ for e in events[-3:]] == ["Fault", "Oom", "Exit"]
    assert len([e for e in events if isinstance(e, Step)]) == written


# -- a CPU memory cap ------------------------------------------------------------------------


@pytest.mark.parametrize("cap", ["200MiB", "1"])
def test_an_oom_under_a_cpu_memory_cap_is_recorded(runs_dir: Path, cap: str) -> None:
    """200 MiB: deepspeed.initialize runs out; 1 byte (the lowest cap there is): the first import after it does.

    Every rank that gets back to Python records its OOM.  At 200 MiB a rank can
    instead be waiting in a gloo collective when its peer fails, and be ended
    by the supervisor (SIGKILL) or abort inside C++ (SIGABRT): no Python code
    runs there, and the supervisor's record keeps the signal.
    """
    build_deepspeed_cpu_ops()
    r = shardtop("launch", "zero3-linear", "--headless", f"gpu_mem_limit={cap}", "max_steps=3", runs_dir=runs_dir)
    assert r.returncode != 0
    run = the_run(runs_dir)
    if "Error building extension" in r.stdout:
        pytest.skip("DeepSpeed rebuilt its shm_comm op under the cap (another build replaced it meanwhile)")
    events, _ = read_all(run.events_dir)
    recorded = {e.rank for e in events if isinstance(e, Oom)}
    exit_record = run.exit_path.read_text() if run.exit_path.exists() else "no exit.json"
    by_signal = {x.rank for x in (run.read_exit() or RunExit(None)).ranks if x.signal is not None}
    assert recorded and recorded | by_signal == {0, 1}, r.stdout + exit_record
    if cap == "1":
        assert recorded == {0, 1}, r.stdout + exit_record
    assert {(e.rank, e.status) for e in events if isinstance(e, Exit)} == {(rank, "oom") for rank in recorded}
    assert all(e.phase == "setup" and e.limit and e.message for e in events if isinstance(e, Oom))
    report = shardtop("report", run.id, runs_dir=runs_dir)
    assert "Out of memory" in report.stdout and "ran out of memory" in report.stdout


def build_deepspeed_cpu_ops() -> None:
    """Build DeepSpeed's CPU ``shm_comm`` op now, uncapped.

    DeepSpeed compiles it the first time a run needs it (and again whenever a
    build with other flags replaced it), and a compiler under the run's cap
    runs out: the rank then fails with "Error building extension", before the
    cap can meet ``deepspeed.initialize``.
    """
    code = ("from deepspeed.accelerator import get_accelerator\n"
            "get_accelerator().create_op_builder('ShareMemCommBuilder').load()")
    done = subprocess.run([sys.executable, "-c", code], env={**os.environ, "DS_ACCELERATOR": "cpu"},
                          capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]


def test_a_cap_too_tight_for_the_memory_thread_samples_at_phase_changes(tmp_path: Path) -> None:
    done = run_script("no-thread", tmp_path / "runs")
    assert done.returncode == 0, done.stderr[-3000:]
    assert "trained 5 steps" in done.stdout
    events, _ = read_all(the_run(tmp_path / "runs").events_dir)
    (fault,) = [e for e in events if isinstance(e, Fault)]
    assert fault.part == "memory" and "can't start new thread" in fault.error
    assert len([e for e in events if isinstance(e, Memory)]) >= 5  # taken at phase changes instead
    assert [(e.status, e.code) for e in events if isinstance(e, Exit)] == [("ok", 0)]


# -- signals and endings ----------------------------------------------------------------------


def test_a_sigterm_of_a_rank_reads_interrupted(runs_dir: Path) -> None:
    launched = subprocess.Popen(
        [sys.executable, "-m", "shardtop", "launch", "zero3-linear-fixed", "--headless", "max_steps=1000000",
         "model.n_layers=8"],
        env={**os.environ, "SHARDTOP_RUNS_DIR": str(runs_dir)}, cwd=ROOT,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    try:
        wait_until(lambda: bool(list_runs(runs_dir)), 180, "the run directory")
        run = the_run(runs_dir)
        wait_until(lambda: any(isinstance(e, Step) and e.rank == 1 for e in read_all(run.events_dir)[0]), 180,
             "rank 1's first step")
        (rank_1,) = [p.pid for p in run.read_meta().rank_pids if p.rank == 1]
        os.kill(rank_1, signal.SIGTERM)
        out, _ = launched.communicate(timeout=120)
    finally:
        if launched.poll() is None:
            launched.kill()
    events, _ = read_all(run.events_dir)
    (exit_1,) = [e for e in events if isinstance(e, Exit) and e.rank == 1]
    assert (exit_1.status, exit_1.signal, exit_1.code) == ("interrupted", signal.SIGTERM, 143)
    assert any("rank 1" in line and "interrupted (SIGTERM)" in line for line in out.splitlines()), out


def test_an_uncaught_oom_of_a_script_is_recorded_then_printed(tmp_path: Path) -> None:
    done = run_script("oom-uncaught", tmp_path / "runs")
    assert done.returncode == 1
    assert "DefaultCPUAllocator: can't allocate memory" in done.stderr  # the previous hook still printed it
    events, _ = read_all(the_run(tmp_path / "runs").events_dir)
    (oom,) = [e for e in events if isinstance(e, Oom)]
    assert oom.module == "2" and oom.attributed_by == "forward-frame"
    assert [e.status for e in events if isinstance(e, Exit)] == ["oom"]


def test_a_sigterm_with_the_default_action_is_recorded_then_ends_the_process(tmp_path: Path) -> None:
    proc = start_script("sigterm", tmp_path / "runs")
    assert proc.wait(timeout=120) == -signal.SIGTERM  # ended by the signal, as without the probe
    events, _ = read_all(the_run(tmp_path / "runs").events_dir)
    assert [(e.status, e.signal, e.code) for e in events if isinstance(e, Exit)] == [
        ("interrupted", signal.SIGTERM, 128 + signal.SIGTERM)
    ]


def test_a_sigterm_goes_on_to_lightnings_own_handler(tmp_path: Path) -> None:
    proc = start_script("lightning-sigterm", tmp_path / "runs")
    out, _ = proc.communicate(timeout=180)
    assert "Received SIGTERM" in out  # Lightning's handler ran, and Lightning ended the run its way
    assert "trained" not in out
    events, _ = read_all(the_run(tmp_path / "runs").events_dir)
    assert [(e.status, e.signal) for e in events if isinstance(e, Exit)] == [("interrupted", signal.SIGTERM)]


def start_script(mode: str, runs_dir: Path) -> subprocess.Popen[str]:
    """Start a script that trains until stopped; SIGTERM it once it has done three steps."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.support.reliability_scripts", mode],
        env=script_env(runs_dir), cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    assert proc.stdout is not None
    for line in proc.stdout:
        if line.startswith("step 3"):
            break
    proc.send_signal(signal.SIGTERM)
    return proc


# -- the probe's own failures ----------------------------------------------------------------


@pytest.mark.parametrize("mode", ["unreadable", "lightning-unreadable"])
def test_a_shard_reader_that_fails_is_switched_off_and_training_goes_on(tmp_path: Path, mode: str) -> None:
    """Also: the raw script calls ``attach()`` and no ``watch()``; its ending is recorded all the same."""
    done = run_script(mode, tmp_path / "runs")
    assert done.returncode == 0, done.stderr[-3000:]
    assert "trained 5 steps" in done.stdout
    assert done.stderr.count("shardtop: the probe's shard reader failed on rank 0") == 1
    events, _ = read_all(the_run(tmp_path / "runs").events_dir)
    (fault,) = [e for e in events if isinstance(e, Fault)]
    assert fault.part == "shards" and ("KeyError" in fault.error or "no placement" in fault.error)
    assert [e.step for e in events if isinstance(e, Step)] == [1, 2, 3, 4, 5]
    assert [(e.status, e.code) for e in events if isinstance(e, Exit)] == [("ok", 0)]
    # every view says the probe lost a part (the report's finding), and the run still reads finished
    report = json.loads(render_report(the_run(tmp_path / "runs"), "json"))
    (lost,) = [f for f in report["findings"] if f["code"] == "probe-fault"]
    assert lost["severity"] == "info" and "shard reader on rank 0" in lost["detail"]
    assert lost["evidence"]["faults"][0]["part"] == "shards"
    assert report["ranks"][0]["status"] == "finished"
