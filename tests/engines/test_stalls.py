"""Ranks that stall, on real two-rank gloo runs under ``shardtop run``: a rank waiting in a collective
that its peer skipped is shown stalled, live, once it has been idle for three of its usual steps; ranks busy
together in one long step are not, nor is a rank that saves the model after the last step its peer ended at."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from shardtop.diagnose import diagnose
from shardtop.read.stalls import MIN_STALL_S, STALL_STEPS
from shardtop.read.whole_run import read_run
from shardtop.rundir.event_files import read_all
from shardtop.rundir.events import Step
from shardtop.rundir.run_directory import list_runs
from tests.support.own_job_runs import ROOT, cli, user_env

SCRIPT = str(ROOT / "tests" / "over_time_scripts" / "skips_collective.py")
STEP_S = 1.0
LONG_RUN_STEP_S = 0.5
"""The long-step run's usual step: its long step (8 of them, 4 s) still outlasts the stall threshold
(``max(3 steps, MIN_STALL_S)``, 2 s) twice over."""


def start(runs: Path, *args: str, step_s: float = STEP_S) -> subprocess.Popen[str]:
    env = {**user_env(), "SHARDTOP_RUNS_DIR": str(runs)}
    return subprocess.Popen(
        [sys.executable, "-m", "shardtop", "run", "--headless", "--", "torchrun", "--standalone",
         "--nproc_per_node", "2", SCRIPT, "--step-s", str(step_s), *args],
        env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )


def test_a_rank_waiting_in_a_collective_its_peer_skipped_is_shown_stalled(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    job = start(runs, "--at", "3")
    try:
        deadline = time.monotonic() + 90
        seen = None
        while time.monotonic() < deadline and seen is None:
            time.sleep(0.2)
            found = list_runs(runs) if runs.exists() else []
            if not found:
                continue
            model = read_run(found[0])
            rank0 = model.rank(0)
            if rank0 is not None and rank0.status.state == "stalled":
                seen = model
        assert seen is not None, "rank 0 never read as stalled"
        stall = seen.stalls[0]
        steps = [e for e in read_all(found[0].events_dir)[0] if isinstance(e, Step) and e.rank == 0]
        assert stall.usual_step_s in {e.seconds for e in steps}, "its usual step is one of the steps it took"
        assert stall.idle_s > max(STALL_STEPS * stall.usual_step_s, MIN_STALL_S)
        rank1 = seen.rank(1)
        assert rank1 is not None and rank1.status.state == "running"
        assert [p.rank for p in stall.peers] == [1]
        finding = next(f for f in diagnose(seen) if f.code == "rank-stalled")
        assert "Rank 0" in finding.title and "collective" in finding.detail
        assert "rank 1 is at step" in finding.detail
    finally:
        found = list_runs(runs) if runs.exists() else []
        if found:
            cli("stop", str(found[0].path), "--grace", "3", runs_dir=runs)
        job.wait(timeout=60)


def test_ranks_busy_together_in_one_long_step_are_not_stalled(tmp_path: Path) -> None:
    states, _ = states_seen(start(tmp_path / "runs", "--long-step", "--at", "3", "--steps", "6",
                                  step_s=LONG_RUN_STEP_S), tmp_path / "runs")
    assert "running" in states and "stalled" not in states


def test_a_rank_saving_after_the_last_step_its_peer_ended_at_is_not_stalled(tmp_path: Path) -> None:
    """Rank 0 spends eight of its steps (past the stall threshold) after training, as a save of the model does,
    while rank 1 has ended after the same last step: no rank is stalled and nothing says it waits."""
    states, said = states_seen(start(tmp_path / "runs", "--steps", "6", "--save-s", str(8 * LONG_RUN_STEP_S),
                                     step_s=LONG_RUN_STEP_S), tmp_path / "runs")
    assert {"running", "finished"} <= states and "stalled" not in states, states
    assert "rank-stalled" not in said and "stalled" not in said, said[-3000:]


def test_a_rank_saving_between_steps_is_not_said_to_wait_in_a_collective(tmp_path: Path) -> None:
    """Rank 0 saves after step 3 while rank 1 waits in step 4's all-reduce: rank 0 reads stalled, between steps,
    and the finding says what was seen (a save or a wait, which nothing tells apart) as information."""
    runs = tmp_path / "runs"
    job = start(runs, "--steps", "5", "--save-at", "3", "--save-s", str(10 * LONG_RUN_STEP_S), step_s=LONG_RUN_STEP_S)
    try:
        seen = None
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and seen is None and job.poll() is None:
            time.sleep(0.2)
            found = list_runs(runs) if runs.exists() else []
            model = read_run(found[0]) if found else None
            if model is not None and 0 in model.stalls:
                seen = model
        assert seen is not None, "rank 0 never read as stalled while it saved"
        stall = seen.stalls[0]
        assert stall.between_steps and stall.step == 3 and [p.rank for p in stall.peers] == [1]
        finding = next(f for f in diagnose(seen) if f.code == "rank-stalled")
        assert finding.severity == "info" and "since it finished step 3" in finding.title
        assert "a save of the model" in finding.detail and "Most likely" not in finding.detail
    finally:
        said = job.communicate(timeout=90)[0]
    assert job.returncode == 0, said
    assert "warning: rank 0 stalled" not in said and "rank 0 stalled: no step begun for" in said, said[-3000:]


def states_seen(job: subprocess.Popen[str], runs: Path) -> tuple[set[str], str]:
    """Every state a rank of the run read as while the job ran, and what ``shardtop run`` printed."""
    states: set[str] = set()
    while job.poll() is None:
        time.sleep(0.3)
        found = list_runs(runs) if runs.exists() else []
        if found:
            states.update(r.status.state for r in read_run(found[0]).ranks)
    said = job.stdout.read() if job.stdout else ""
    assert job.returncode == 0, said
    return states, said
