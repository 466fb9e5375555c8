"""After a run: the plan it wrote at set-up, against what its ranks measured, and ``plan-missed``.

- Real CPU preset runs (the cached ``real_runs.STORIES`` runs: ``shardtop
  launch PRESET accelerator=cpu --headless``): rank 0 wrote the plan of the
  strategy it ran, and the report pairs it with each rank's parameters,
  gradients and optimizer state (CPU processes have no allocator peak).
- The H200 recordings, given the plan their rank 0 writes today
  (``tests/support/plan_runs.py``): the peaks of finished runs are within the 10 %
  the plan is held to; runs that ran out of memory where the plan said they
  would are no miss.
- A plan that missed: ``h200-over-time/manual-placement`` as recorded, with the
  plan its rank 0 wrote at set-up, which counted no convolution workspace:
  15 % low, and ``plan-missed`` says so.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from shardtop.diagnose import diagnose
from shardtop.read.plan_check import MISS_RATIO
from shardtop.read.run_model import RunModel
from shardtop.read.whole_run import read_run
from shardtop.report import render_report
from shardtop.rundir.event_files import read_all
from shardtop.rundir.events import Planned
from shardtop.rundir.run_directory import RunDirectory
from tests.diagnose_scripts.real_runs import report_json, runs_base, story
from tests.support.plan_runs import with_plan
from tests.support.recorded import recorded_run

TOLERANCE = 0.02
"""As ``tests/engines/test_plan_presets.py``: the plan's parts against a real CPU run."""


@pytest.fixture(scope="module")
def real_base(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return runs_base(tmp_path_factory)


@pytest.mark.parametrize("preset", ["fsdp2-mlp", "zero3-linear", "ddp-baseline"])
def test_a_preset_run_records_its_plan_and_the_report_pairs_it_per_rank(preset: str, real_base: Path) -> None:
    real = story(real_base, preset)
    events, _ = read_all(real.path / "events")
    plans = [e for e in events if isinstance(e, Planned)]
    assert len(plans) == 1 and plans[0].rank == 0 and plans[0].made_by == "preset", real.describe()
    config = real.run.read_meta().config.settings
    assert plans[0].devices == int(config["devices"]) and plans[0].accelerator == "cpu"

    plan = report_json(real)["plan"]
    assert plan["strategy"] == plans[0].strategy
    assert [r["rank"] for r in plan["per_rank"]] == list(range(int(config["world_size"])))
    for r in plan["per_rank"]:
        predicted, measured, error = r["predicted"], r["measured"], r["error"]
        assert r["reached"] == "next backward" and r["complete"], r
        assert abs(error["params"]) <= TOLERANCE, r
        assert abs(error["optimizer"]) <= TOLERANCE, r
        assert measured["grads"] is None or abs(error["grads"]) <= TOLERANCE, r
        assert measured["peak"] is None and error["peak"] is None and not r["missed"], "a CPU process has no allocator"
        assert predicted["peak"] == predicted["plan_peak"]
    assert "plan-missed" not in [f["code"] for f in report_json(real)["findings"]]


def test_the_text_report_shows_the_plan_against_the_run(real_base: Path) -> None:
    out = render_report(story(real_base, "fsdp2-mlp").run, "text")
    section = out[out.index("Plan against the run"):]
    assert "Planned by rank 0 of the preset run at set-up: FSDP2, fp32" in section
    assert "No peak was measured: CPU processes have no allocator to ask" in section


def _recorded(name: str, tmp_path: Path) -> tuple[RunDirectory, RunModel]:
    """A copy of the recording ``name``, with the plan its rank 0 writes today, and its read model."""
    copy = tmp_path / recorded_run(name).name
    shutil.copytree(recorded_run(name), copy)
    run = with_plan(copy)
    return run, read_run(run)


@pytest.mark.parametrize("name", ["h200/fsdp-not-sharding", "h200/fsdp-auto-wrap", "h200/ddp-baseline",
                                  "h200/fsdp2-mlp"])
def test_a_finished_gpu_run_meets_its_plan(name: str, tmp_path: Path) -> None:
    _, model = _recorded(name, tmp_path)
    check = model.plan_check
    assert check is not None and check.plan.fits is True
    for r in check.ranks:
        assert r.complete and r.peak_error is not None
        assert abs(r.peak_error) <= MISS_RATIO and not r.missed, (r.predicted_peak, r.measured.peak)
        assert r.errors["params"] == 0.0  # the parts agree to the byte
    assert "plan-missed" not in [f.code for f in diagnose(model)]


def test_a_run_the_plan_misses_is_a_finding_that_says_what_matched() -> None:
    """manual-placement on the H200 peaked 15 % above the plan its rank 0 wrote, which counted no
    convolution workspace; the parts match, and the finding says what the probe found at the peak."""
    run = RunDirectory(recorded_run("h200-over-time/manual-placement"))
    model = read_run(run)
    finding = next(f for f in diagnose(model) if f.code == "plan-missed")
    e = finding.evidence
    assert (e.rank, e.reached, e.peak_source) == (0, "next backward", "allocator peak")  # type: ignore[attr-defined]
    assert e.error == pytest.approx(-0.154, abs=0.005)  # type: ignore[attr-defined]
    assert e.parts_compared == ("params", "grads", "optimizer") and e.largest_part is None  # type: ignore[attr-defined]
    assert e.planned_conv_workspace == 0  # type: ignore[attr-defined]
    assert finding.title == "The plan was 15 % low: rank 0 peaked at 1.51 GiB, planned 1.27 GiB"
    assert "The parameters and gradients and optimizer state match the plan" in finding.detail
    assert "At rank 0's peak (step 2, backward) the probe found 1.5 GiB allocated" in finding.detail
    assert "0 B of cuDNN convolution workspace" in finding.detail
    assert finding.severity == "warning"
    data = json.loads(render_report(run, "json"))
    assert data["plan"]["per_rank"][0]["missed"] is True
    missed = next(f for f in data["findings"] if f["code"] == "plan-missed")
    assert missed["evidence"]["measured_peak"] == e.measured_peak  # type: ignore[attr-defined]


@pytest.mark.parametrize("name", ["h200/zero3-linear", "h200x2/zero3-linear"])
def test_a_run_that_ran_out_where_the_plan_said_is_no_miss(name: str, tmp_path: Path) -> None:
    run, model = _recorded(name, tmp_path)
    check = model.plan_check
    assert check is not None and check.plan.fits is False and check.plan.runs_out_at == "set-up"
    for r in check.ranks:
        assert r.out_of_memory and r.reached == "set-up" and r.peak_error is None and not r.missed
    assert "plan-missed" not in [f.code for f in diagnose(model)]
    assert "out of memory, as planned" in render_report(run, "text")


def test_a_run_stopped_in_set_up_cannot_show_the_plan_high(tmp_path: Path) -> None:
    """Story 2 fixed on two H200s was stopped during DeepSpeed's set-up: its peak so far (each rank's half of
    the model) is below the plan's set-up peak, which it had not reached; no error, no miss."""
    _, model = _recorded("h200x2/zero3-linear-fixed", tmp_path)
    check = model.plan_check
    assert check is not None
    for r in check.ranks:
        assert not r.out_of_memory and not r.complete and r.reached == "set-up"
        assert r.measured.peak is not None and r.measured.peak < r.predicted_peak
        assert r.peak_error is None and not r.missed
    assert "plan-missed" not in [f.code for f in diagnose(model)]
