"""Memory that grows, recorded on an H200 (``tests/fixtures/runs/h200-over-time``, ``gpu/record.sh over_time``):
a plain loop that appends each step's float32 logits (4 x 512 x 32 000: 250 MiB) to a list, under a 24 GiB
cap it sets itself (``torch.cuda.set_per_process_memory_fraction``), until it runs out at step 90.

- the finding gives the rate and the module that made what is kept, and projects the step the rank runs out
  at within 10 % of step 90 already from the steps before 30, as a user watching it live would read it;
- the peak is explained to 95 %, the kept tensors as their own kind;
- the small recordings made beside it explain their peaks too: cuBLAS's workspaces are a kind, not a gap.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from shardtop.read.memory_kinds import explained_share
from shardtop.read.whole_run import read_run
from shardtop.rundir.run_directory import RunDirectory
from tests.support.cli import report

RECORDINGS = Path(__file__).resolve().parents[1] / "fixtures" / "runs" / "h200-over-time"
LOGITS = 4 * 512 * 32000 * 4
OOM_STEP = 90


def recording(name: str) -> Path:
    found = [p for p in sorted(RECORDINGS.iterdir()) if p.is_dir() and p.name[16:-5] == name]
    assert len(found) == 1, (name, found)
    return found[0]


def until_step(run: Path, last: int, into: Path) -> Path:
    """A copy of ``run`` whose events end where step ``last`` begins: the run as it stood then."""
    copy = into / run.name
    shutil.copytree(run, copy)
    (copy / "exit.json").unlink(missing_ok=True)
    for path in (copy / "events").glob("rank-*.jsonl"):
        kept: list[str] = []
        for line in path.read_text().splitlines(keepends=True):
            event = json.loads(line)
            if event.get("kind") in ("step", "phase") and int(event.get("step") or 0) >= last:
                break
            kept.append(line)
        path.write_text("".join(kept))
    return copy


def test_the_growth_is_told_with_its_rate_its_maker_and_when_it_runs_out() -> None:
    data: dict[str, Any] = json.loads(report(recording("kept-logits"), "json"))
    assert (data["oom"]["step"], data["oom"]["module"]) == (OOM_STEP, "head")
    finding = next(f for f in data["findings"] if f["code"] == "memory-grows-every-step")
    growth = finding["evidence"]["growth"]
    assert abs(growth["rate"] - LOGITS) <= 0.01 * LOGITS
    assert growth["limit"] == 24 << 30, "the cap the script set itself"
    kept = finding["evidence"]["kept"][0]
    assert (kept["module"], kept["shape"], kept["dtype"], kept["bytes"]) == ("head", [4, 512, 32000], "float32", LOGITS)
    rank = data["ranks"][0]["growth"]
    assert abs(rank["out_of_memory_step"] - OOM_STEP) <= 0.1 * OOM_STEP
    assert "reaches its memory cap (24 GiB) at about step" in finding["detail"], finding["detail"]


@pytest.mark.parametrize("seen_until", [30, 60])
def test_the_projection_made_while_it_ran_lands_within_ten_percent(seen_until: int, tmp_path: Path) -> None:
    model = read_run(RunDirectory(until_step(recording("kept-logits"), seen_until, tmp_path)))
    growth = model.growth.get(0)
    assert growth is not None and growth.last_step < seen_until
    projected = growth.out_of_memory_step
    assert projected is not None and abs(projected - OOM_STEP) <= 0.1 * OOM_STEP, projected


@pytest.mark.parametrize("name", ["kept-logits", "gpu-outside-pytorch", "manual-placement"])
def test_each_peak_is_explained_to_95_percent(name: str) -> None:
    model = read_run(RunDirectory(recording(name)))
    split = model.ranks[0].memory_peak
    assert split is not None and split.allocated is not None
    share = explained_share(split)
    assert share is not None and share >= 0.95, (name, share, split)
    if name == "kept-logits":  # split by a census (the trace ran in the first steps): no workspace read
        assert split.by_kind.kept is not None and split.by_kind.kept >= 0.85 * split.allocated
    else:
        assert split.by_kind.workspace == 2 * 32 << 20


def test_an_oom_whose_peak_is_mostly_kept_tensors_points_at_what_keeps_them() -> None:
    data: dict[str, Any] = json.loads(report(recording("kept-logits"), "json"))
    oom = next(f for f in data["findings"] if f["code"] == "oom")
    assert "kept from earlier steps" in oom["fix"] and "Activations did not fit" not in oom["fix"], oom["fix"]
