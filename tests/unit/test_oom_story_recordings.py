"""OOMs that sharding does not fix, recorded on an H100 (``tests/fixtures/runs/h100-oom-stories``,
``gpu/record.sh oom_stories``, torch 2.11): an evaluation loop that keeps every batch's outputs with their
autograd graphs, under a 20 GiB cap, and a loss over a 32 000-token vocabulary that finishes.

- the OOM is told from what filled the memory: tensors kept from earlier forwards, with what holds them,
  and the fix is ``torch.no_grad()``, never sharding or a smaller micro-batch;
- the split at the OOM accounts for every allocated byte;
- the allocator snapshots the run wrote open with the command the report prints (PyTorch's
  ``torch.cuda._memory_viz``), at the OOM and at a finished run's peak.
"""

from __future__ import annotations

import json
import pickle
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

from shardtop.units import format_bytes
from tests.support.cli import report

RECORDINGS = Path(__file__).resolve().parents[1] / "fixtures" / "runs" / "h100-oom-stories"
KEEPS_GRAPHS = RECORDINGS / "20261206-163541-eval-keeps-graphs-f3e2"
SMALL_VOCAB = RECORDINGS / "20261206-163614-small-vocab-87ea"


def test_outputs_kept_with_their_graphs_are_told_with_what_holds_them_and_no_grad_as_the_fix() -> None:
    data: dict[str, Any] = json.loads(report(KEEPS_GRAPHS, "json"))
    oom = data["oom"]
    assert (oom["phase"], oom["module"]) == ("forward", "blocks.2")
    split = oom["memory"]
    held = {kind: n for kind, n in split["by_kind"].items() if n}
    assert held["kept"] > 0.75 * sum(held.values()), held
    assert oom["kept_graph_bytes"] == held["kept"]  # all of it through the graphs of earlier forwards
    assert split["unexplained"] == 0 and sum(held.values()) == split["allocated"] == oom["allocated"]
    assert oom["kept_by"].startswith("`outputs` in evaluate (eval_keeps_graphs.py:60), 10 tensors")
    (finding,) = [f for f in data["findings"] if f["code"] == "oom"]
    assert "torch.no_grad()" in finding["fix"] and "with their autograd graphs" in finding["fix"]
    assert "at the OOM (16.4 GiB)" in finding["fix"] and format_bytes(split["allocated"]) == "19.7 GiB"
    assert oom["kept_by"].endswith(", 4.88 GiB")
    assert "shard the model" not in finding["fix"] and "activation checkpointing on" not in finding["fix"]


def _snapshot_command(text: str, run: Path) -> list[str]:
    """The command the report prints to open a snapshot in a browser."""
    (line,) = [ln for ln in text.splitlines() if "torch.cuda._memory_viz" in ln]
    command = line.split("Open one in a browser: ", 1)[1].split(", or drag", 1)[0]
    words = shlex.split(command)
    assert words[:3] == ["python", "-m", "torch.cuda._memory_viz"] and str(run) in command
    return [sys.executable, *words[1:]]


def test_the_snapshots_open_with_the_command_the_report_prints(tmp_path: Path) -> None:
    for run, moment in ((KEEPS_GRAPHS, "oom"), (SMALL_VOCAB, "peak")):
        data = json.loads(report(run, "json"))
        (written,) = data["ranks"][0]["snapshots"]
        assert (written["moment"], written["file"], written["cut"]) == (moment, f"snapshots/rank-0-{moment}.pickle",
                                                                        False)
        snapshot = pickle.loads((run / written["file"]).read_bytes())
        assert len(snapshot["device_traces"][0]) == written["entries"] > 0
        command = _snapshot_command(report(run, "text"), run)
        out = tmp_path / f"{moment}.html"
        command[command.index("-o") + 1] = str(out)
        done = subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)
        assert done.returncode == 0, done.stderr
        page = out.read_text()
        assert page.lstrip().startswith("<!DOCTYPE html>") and "Active Memory Timeline" in page and len(page) > 10_000
    at_oom = pickle.loads((KEEPS_GRAPHS / "snapshots" / "rank-0-oom.pickle").read_bytes())
    reserved = sum(segment["total_size"] for segment in at_oom["segments"])
    assert 20 << 30 >= reserved >= json.loads(report(KEEPS_GRAPHS, "json"))["oom"]["allocated"]  # under the cap
