"""torch.compile under FSDP2, a user's torchrun script under ``shardtop run``: the probe's hooks run
eagerly around the compiled forward, so each step is counted once, the tree keeps the model's own names
(no ``_orig_mod``) and the probe does not stop."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.support.cli import ROOT
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


HOOKS_BEFORE_DYNAMO = """
import sys, torch
from shardtop.inject import model_hooks
from shardtop.inject.engines import patch_dynamo
from shardtop.inject.this_rank import STATE
calls = []
model_hooks._root_forward = lambda module, args: calls.append(f"probe-pre traced={torch.compiler.is_compiling()}")
model_hooks._root_output = lambda module, args, out: calls.append(f"probe-post traced={torch.compiler.is_compiling()}")
model = torch.nn.Linear(2, 2)
model.register_forward_pre_hook(lambda module, args: calls.append("user-pre"))
STATE.root_hooks = [model.register_forward_pre_hook(model_hooks._as_hook(model_hooks._root_forward)),
                    model.register_forward_hook(model_hooks._as_hook(model_hooks._root_output))]
loaded_before = "torch._dynamo" in sys.modules
import torch._dynamo
patch_dynamo(torch._dynamo)
compiled = torch.compile(model, backend="eager")
for _ in range(3):
    compiled(torch.ones(1, 2))
print(loaded_before, calls)
"""


def test_the_roots_hooks_set_before_dynamo_loads_run_on_every_compiled_call() -> None:
    """The probe does not load dynamo itself (about a second of a rank's CPU); once ``torch.compile`` loads
    it, the root's hooks become eager where they stand, after the user's own hook, on every call."""
    done = subprocess.run([sys.executable, "-c", HOOKS_BEFORE_DYNAMO], capture_output=True, text=True, timeout=120,
                          cwd=ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    loaded_before, calls = done.stdout.split(" ", 1)
    assert loaded_before == "False"
    assert calls.strip() == str(["user-pre", "probe-pre traced=False", "probe-post traced=False"] * 3)
