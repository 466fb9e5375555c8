"""torch.compile under FSDP2, a user's torchrun script under ``shardtop run``: the probe's hooks run
eagerly around the compiled forward, so each step is counted once, the tree keeps the model's own names
(no ``_orig_mod``) and the probe does not stop."""

from __future__ import annotations

import json
from pathlib import Path

from tests.support.own_job_runs import SCRIPTS, run_own


def test_a_compiled_fsdp2_model_is_read_like_an_eager_one(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    run = run_own(runs, "torchrun", "--standalone", "--nproc_per_node", "2", str(SCRIPTS / "fsdp2_train.py"),
                  "--compile", "--steps", "4")
    assert run.code == 0, run.describe()
    report = run.report(runs)
    assert report["engine"] == "fsdp2"
    assert [r["step"] for r in report["ranks"]] == [4, 4]
    paths = [m["path"] for m in report["modules"]]
    assert "blocks.0.fc" in paths and not any("_orig_mod" in p for p in paths)
    assert not [f for f in report["findings"] if f["code"].startswith("probe")], json.dumps(report["findings"])[:500]
    assert "the probe stopped" not in run.command_log()
