"""Under ``shardtop run``, the job's own code sees what it sees alone: its objects, attributes and results.

The probe reads autograd's graph and never hooks into it: a custom
``autograd.Function`` gets back the very parameter it saved, with the
attributes set on it (TRL's chunked loss reads DeepSpeed's ``ds_status`` off
it), and ``torch.func`` still runs inside a forward.  Both happen in the steps
the probe explains, whose activations it still counts.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from shardtop.rundir.run_directory import list_runs
from tests.support.cli import shardtop
from tests.support.own_job_runs import SCRIPTS, run_own, user_env

SCRIPT = SCRIPTS / "saved_parameter_attrs.py"


def _losses(output: str) -> list[str]:
    return [line for line in output.splitlines() if line.startswith("step ")]


@pytest.mark.parametrize("saves", ["parameter", "copy"])
def test_a_function_that_reads_its_saved_parameter_trains_as_alone(tmp_path: Path, saves: str) -> None:
    alone = subprocess.run([sys.executable, str(SCRIPT), "--saves", saves], capture_output=True, text=True,
                           env=user_env(), timeout=120)
    assert alone.returncode == 0, alone.stderr
    assert len(_losses(alone.stdout)) == 4

    ran = run_own(tmp_path / "runs", "python", str(SCRIPT), "--saves", saves)
    assert ran.code == 0, ran.describe()
    assert _losses(ran.command_log()) == _losses(alone.stdout), ran.describe()

    report = ran.report(tmp_path / "runs")
    rows = {m["path"]: m for m in report["modules"]}
    # The explained steps still measured what autograd held: the body's Linear saved its input batch.
    assert rows["body"]["ranks"][0]["act_bytes"] == 8 * 16 * 4, ran.describe()


def test_a_fabric_loop_that_waits_for_rank_zero_first_is_rehearsed(tmp_path: Path) -> None:
    """Fabric's ``rank_zero_first`` waits in a barrier of the process group's own (litgpt prepares its data
    so): rehearsed as ranks 0 and 7 of 8, both train, each holding the whole replicated model."""
    runs = tmp_path / "runs"
    done = shardtop("rehearse", "devices=8", "rank=0,last", "--headless", "--", "python",
                    str(SCRIPTS / "fabric_train.py"), runs_dir=runs, env=user_env(), timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    (run,) = list_runs(runs)
    report = json.loads(shardtop("report", str(run.path), "--format", "json", runs_dir=runs, env=user_env()).stdout)
    assert report["engine"] == "ddp" and report["world_size"] == 8
    model = 32 * 64 + 64 + 64 + 1  # Linear(32, 64) and Linear(64, 1), float32
    assert {r["rank"]: (r["param_bytes"], r["step"]) for r in report["ranks"]} == {0: (4 * model, 3), 7: (4 * model, 3)}
