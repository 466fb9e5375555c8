"""A user's own script with ShardtopCallback() is a run like any preset run."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from shardtop.rundir.event_files import read_all
from shardtop.rundir.events import Exit, Hello, Shards, Step
from shardtop.rundir.run_directory import list_runs
from tests.support.cli import ROOT, shardtop


def test_lightning_script_with_the_callback_is_listed_and_reported(runs_dir: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("SHARDTOP_RUN_DIR", "LOCAL_RANK", "RANK", "WORLD_SIZE")}
    env.update(SHARDTOP_RUNS_DIR=str(runs_dir), PYTHONPATH=str(ROOT))
    done = subprocess.run(
        [sys.executable, str(ROOT / "tests" / "user_scripts" / "lightning_ddp.py")],
        env=env, capture_output=True, text=True, timeout=600, cwd=runs_dir.parent,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    (run,) = list_runs(runs_dir)  # one run for both ranks: rank 0 made it, rank 1 was told
    events, _ = read_all(run.events_dir)
    assert {e.rank for e in events if isinstance(e, Hello)} == {0, 1}
    assert all(e.engine == "ddp" for e in events if isinstance(e, Hello))
    assert {e.rank for e in events if isinstance(e, Shards) and e.engine == "ddp"} == {0, 1}
    assert sorted(e.step for e in events if isinstance(e, Step) and e.rank == 0) == [1, 2, 3]
    assert {e.rank for e in events if isinstance(e, Exit) and e.code == 0} == {0, 1}
    listing = shardtop("runs", runs_dir=runs_dir)
    assert run.id in listing.stdout and "finished" in listing.stdout
    report = shardtop("report", run.id, "--format", "json", runs_dir=runs_dir)
    assert report.returncode == 0 and '"engine": "ddp"' in report.stdout
