"""A rank that fails because the run was being stopped reads as interrupted, every time; a rank that
failed on its own before any stop stays failed.  Real two-rank gloo runs under ``shardtop run``."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from shardtop.read.rank_facts import rank_status
from shardtop.read.run_state import RankState
from shardtop.read.whole_run import read_run
from shardtop.rundir.events import Exit
from shardtop.rundir.run_directory import list_runs
from shardtop.rundir.run_status import RunExit, RunStatus
from tests.support.own_job_runs import ROOT, cli, run_own, user_env

SCRIPT = str(ROOT / "tests" / "own_scripts" / "stop_race.py")


def _status(exit_t: float, stop_requested: float | None) -> str:
    state = RankState(rank=0, exit=Exit(rank=0, host="h", t=exit_t, code=1, status="error", error="Connection closed"))
    record = RunExit(code=143, signal=15, reason="stopped", ending="stopped", stop_requested=stop_requested)
    run = RunStatus("stopped", record)
    return rank_status(state, run).state


def test_a_failure_after_the_stop_was_asked_is_the_stops_and_one_before_it_is_not() -> None:
    assert _status(exit_t=100.4, stop_requested=100.0) == "interrupted"
    assert _status(exit_t=90.0, stop_requested=100.0) == "failed"
    assert _status(exit_t=100.4, stop_requested=None) == "failed"


def test_a_rank_broken_by_its_stopped_peer_reads_interrupted(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    job = subprocess.Popen(
        [sys.executable, "-m", "shardtop", "run", "--headless", "--", "torchrun", "--standalone",
         "--nproc_per_node", "2", SCRIPT],
        env={**user_env(), "SHARDTOP_RUNS_DIR": str(runs)}, cwd=ROOT,
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            found = list_runs(runs) if runs.exists() else []
            if found and read_run(found[0]).step >= 3:
                break
            time.sleep(0.3)
        run = list_runs(runs)[0]
        assert cli("stop", str(run.path), "--grace", "8", runs_dir=runs).returncode == 0
    finally:
        job.wait(timeout=60)
    model = read_run(run)
    rank0 = model.rank(0)
    assert rank0 is not None and rank0.exit is not None and rank0.exit.status == "error"  # its own record: a failure
    states = {r.rank: r.status for r in model.ranks}
    assert set(states) == {0, 1}
    assert all(s.state == "interrupted" for s in states.values()), states
    assert model.status is not None and model.status.state == "stopped"


def test_a_rank_that_failed_on_its_own_stays_failed(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    run = run_own(runs, "torchrun", "--standalone", "--nproc_per_node", "2", SCRIPT, "--fail-at", "3")
    assert run.code != 0
    rank1 = read_run(run.run).rank(1)
    assert rank1 is not None and rank1.status.state == "failed"
    assert "a bug of the script's own" in rank1.status.detail
