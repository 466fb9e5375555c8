"""The README's main job on a machine without a GPU: story 2 as asked runs out of memory building the model,
at the layer that no longer fits, and says why; fixed, it trains.

The commands are the README's, with ``--headless`` (a test has no terminal).  On CPU the presets run at
their ``on_cpu`` sizes: 96 layers of ``Linear(512, 512)`` on two ranks, as asked under an 80 MiB cap that
the ranks' C allocator keeps (``shardtop/runner/cpu_cap.c``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from shardtop.rundir.run_directory import RunDirectory, list_runs
from tests.support.cli import shardtop

LAYER = 512 * 512 * 4 + 512 * 4
"""One ``Linear(512, 512)`` in fp32, weight and bias."""


def _launch(runs_dir: Path, *words: str) -> tuple[str, RunDirectory, dict[str, Any]]:
    done = shardtop("launch", *words, "--headless", runs_dir=runs_dir, timeout=600)
    (run,) = list_runs(runs_dir)
    report = shardtop("report", str(run.path), "--format", "json", runs_dir=runs_dir)
    assert report.returncode == 0, report.stderr
    return done.stdout + done.stderr, run, json.loads(report.stdout)


@pytest.fixture(scope="module")
def as_asked(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, RunDirectory, dict[str, Any]]:
    return _launch(tmp_path_factory.mktemp("as-asked"), "preset=zero3-linear")


def test_as_asked_a_rank_runs_out_building_the_whole_model_at_the_layer_that_no_longer_fits(
    as_asked: tuple[str, RunDirectory, dict[str, Any]],
) -> None:
    output, run, report = as_asked
    assert run.status().state == "failed", output
    oom = report["oom"]
    assert (oom["phase"], oom["module_type"], oom["engine_step"]) == ("setup", "Linear", None), output
    assert oom["module"].startswith("net.") and oom["requested_bytes"] == 512 * 512 * 4
    assert oom["limit"] == 80 << 20 and oom["allocated"] + oom["requested_bytes"] > oom["limit"]
    assert f"ran out of memory on cpu during setup in {oom['module']} (Linear)" in output
    # The tree exists and says how far the build got: every layer before the culprit held whole on each rank,
    # the culprit and those after it not allocated yet.
    culprit = int(oom["module"].split(".")[1])
    rows = {m["path"]: m for m in report["modules"]}
    assert len([p for p in rows if p.startswith("net.")]) == 96
    for index in (0, culprit - 1):
        assert [(r["device"], r["bytes"]) for r in rows[f"net.{index}"]["ranks"]] == [("cpu", LAYER)] * 2
    for index in (culprit, 95):
        assert {r["device"] for r in rows[f"net.{index}"]["ranks"]} == {"meta"}
    # The finding is story 2's, with the OOM it caused and the fix.
    first = report["findings"][0]
    assert first["code"] == "zero3-not-partitioned-at-init" and first["severity"] == "error"
    assert first["modules"] == [oom["module"]]
    assert f"ran out of memory allocating `{oom['module']}`" in first["detail"]
    assert "deepspeed.zero.Init" in first["fix"]
    assert "oom" not in {f["code"] for f in report["findings"]}  # the finding explains it: no generic one


def test_fixed_each_rank_builds_its_half_and_trains(tmp_path: Path) -> None:
    output, run, report = _launch(tmp_path, "preset=zero3-linear-fixed")
    assert run.status().state == "finished", output
    assert report["oom"] is None and report["engine"] == "zero3"
    halves = [r["param_bytes"] for r in report["ranks"]]
    assert len(halves) == 2 and abs(halves[0] - halves[1]) <= 4 * 1024  # the partitions' padding at most
    assert "zero3-not-partitioned-at-init" not in {f["code"] for f in report["findings"]}
