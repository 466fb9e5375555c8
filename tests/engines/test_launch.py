"""End to end, with real processes: launch, follow, list, stop."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil

from shardtop.rundir.event_files import read_all
from shardtop.rundir.events import Exit, Hello, Step
from shardtop.rundir.run_directory import list_runs
from tests.support.cli import shardtop


def test_headless_fsdp2_run_on_cpu_records_both_ranks(runs_dir: Path) -> None:
    r = shardtop("launch", "preset=fsdp2-mlp", "--headless", "max_steps=3", runs_dir=runs_dir)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "2 rank(s) up (fsdp2" in r.stdout
    assert "exit 0: finished" in r.stdout
    (run,) = list_runs(runs_dir)
    events, skipped = read_all(run.events_dir)
    assert sum(skipped.values()) == 0
    for rank in (0, 1):
        mine = [e for e in events if e.rank == rank]
        assert any(isinstance(e, Hello) and e.world_size == 2 and e.engine == "fsdp2" for e in mine)
        assert [e.step for e in mine if isinstance(e, Step)] == [1, 2, 3]
        assert any(isinstance(e, Exit) and e.code == 0 and e.status == "ok" for e in mine)
    assert run.status().state == "finished"
    for path in (run.path, run.events_dir, run.logs_dir):
        assert path.stat().st_mode & 0o077 == 0
    assert "finished" in shardtop("runs", runs_dir=runs_dir).stdout


def test_unknown_preset_exits_2_and_creates_nothing(runs_dir: Path) -> None:
    r = shardtop("launch", "preset=does-not-exist", runs_dir=runs_dir)
    assert r.returncode == 2
    assert "unknown preset 'does-not-exist'" in r.stderr and "Traceback" not in r.stderr
    assert not runs_dir.exists() or not any(runs_dir.iterdir())


def test_bad_values_exit_2_and_create_nothing(runs_dir: Path) -> None:
    for args, message in [
        (("fsdp2-mlp", "model.n_layers=many"), "expected an integer"),
        (("fsdp2-mlp", "max_step=3"), "Did you mean max_steps"),
        (("fsdp2-mlp", "max_steps"), "expected key=value"),
        (("fsdp2-mlp", "accelerator=cuda"), "no NVIDIA GPU is visible"),
        (("zero3-linear-fixed", "zero.offload_optimizer=gpu"), "expected one of none, cpu"),
    ]:
        r = shardtop("launch", *args, "--headless", runs_dir=runs_dir, env={"CUDA_VISIBLE_DEVICES": ""})
        assert r.returncode == 2, (args, r.stderr)
        assert message in r.stderr and "Traceback" not in r.stderr
    assert not runs_dir.exists() or not any(runs_dir.iterdir())


def test_stop_ends_every_process_of_the_run_and_nothing_else(runs_dir: Path) -> None:
    bystander = subprocess.Popen(["sleep", "120"], start_new_session=True)
    try:
        launched = subprocess.Popen(
            [sys.executable, "-m", "shardtop", "launch", "fsdp2-mlp", "--headless", "max_steps=1000000"],
            env={**os.environ, "SHARDTOP_RUNS_DIR": str(runs_dir)},
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )
        run = _wait_for_steps(runs_dir)
        meta = run.read_meta()
        pids = [meta.pid, *(p.pid for p in meta.rank_pids)]
        assert all(psutil.pid_exists(p) for p in pids)
        r = shardtop("stop", run.id, "--grace", "20", runs_dir=runs_dir)
        assert r.returncode == 0, r.stderr
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and any(_running(p) for p in pids):
            time.sleep(0.2)
        assert not any(_running(p) for p in pids)
        assert bystander.poll() is None, "stop touched a process that is not the run's"
        assert run.status().state == "stopped"
        out, _ = launched.communicate(timeout=60)
        assert launched.returncode != 0
        assert "stopped" in shardtop("runs", runs_dir=runs_dir).stdout
    finally:
        bystander.send_signal(signal.SIGKILL)
        bystander.wait()


def _running(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _wait_for_steps(runs_dir: Path, timeout: float = 120):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        runs = list_runs(runs_dir)
        if runs:
            events, _ = read_all(runs[0].events_dir)
            if {e.rank for e in events if isinstance(e, Step)} == {0, 1}:
                return runs[0]
        time.sleep(0.3)
    raise AssertionError("the run did not reach a training step in time")
