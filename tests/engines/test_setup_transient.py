"""A rank that runs out of memory inside ``fully_shard`` is told as a moment of set-up, not as ranks
holding unequal shares; and the plan is held to the phase it named.

The issue's own run, recorded (``tests/fixtures/runs/cpu-fully-shard-oom/``: ``shardtop launch
fsdp2-mlp gpu_mem_limit=200MiB`` on two CPU processes): rank 0 ran out inside ``fully_shard`` while
rank 1, past it, waited.  Which rank runs out first is decided by a few MiB of the ranks' own
overhead, so that case is kept as a recording rather than made again.

Two real CPU runs of ``fsdp2-mlp`` with one large block (``model.n_layers=1 model.hidden=4096``:
384 MiB of parameters, 256 MiB of them in the block, sharded 128 MiB a rank), so that each cap sits
inside its window whichever way the CPU cap is kept (the allocator cap, or the data segment where no C
compiler builds it; measured on this machine): at 490 MiB a rank runs out while ``fully_shard`` holds
the whole model beside the shards it has made (from about 395 or 460 MiB up to 525 or 570 MiB); at 650
MiB set-up passes and the ranks run out in the first forward pass.  Read back as a user reads them: the
headless lines, ``shardtop report``, text and JSON.
"""

from __future__ import annotations

import io
import json
import shutil
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from shardtop.diagnose import diagnose
from shardtop.headless import follow
from shardtop.read.run_fold import fold
from shardtop.read.run_model import RunModel
from shardtop.rundir.events import Event, Hello, Oom, Shards, Tree
from shardtop.rundir.run_directory import RunDirectory
from tests.diagnose_scripts.real_runs import RealRun, codes, preset_run, report_json, runs_base
from tests.support.built_runs import stamp
from tests.support.cli import report

RECORDED = Path(__file__).resolve().parents[1] / "fixtures" / "runs" / "cpu-fully-shard-oom"

ONE_BIG_BLOCK = ("max_steps=2", "model.n_layers=1", "model.hidden=4096")
IN_FULLY_SHARD = "gpu_mem_limit=490MiB"
PAST_SET_UP = "gpu_mem_limit=650MiB"


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, RealRun]]:
    base = runs_base(tmp_path_factory)
    with ThreadPoolExecutor(max_workers=2) as pool:
        made = {cap: pool.submit(preset_run, base, "fsdp2-mlp", *ONE_BIG_BLOCK, cap)
                for cap in (IN_FULLY_SHARD, PAST_SET_UP)}
        yield {cap: future.result() for cap, future in made.items()}


def _finding(report: dict[str, Any], code: str) -> dict[str, Any]:
    (found,) = [f for f in report["findings"] if f["code"] == code]
    return found


def json_report(path: Path) -> dict[str, Any]:
    """``shardtop report PATH --format json`` of a recorded run."""
    return dict(json.loads(report(path, "json")))


def test_out_of_memory_inside_fully_shard_is_a_set_up_moment_not_an_imbalance(runs: dict[str, RealRun]) -> None:
    run = runs[IN_FULLY_SHARD]
    data = report_json(run)
    oom = data["oom"]
    assert (oom["phase"], oom["engine_step"]) == ("setup", "fully_shard"), run.describe()
    assert "placement-imbalance" not in codes(data), data["findings"]
    assert codes(data)[0] == "sharding-transient-at-setup", codes(data)
    f = _finding(data, "sharding-transient-at-setup")
    ev = f["evidence"]
    model = data["model"]["bytes"]
    assert f["severity"] == "error" and ev["oom"]["rank"] == oom["rank"]
    # nothing was freed yet: the modules not reached and those being sharded are all still whole
    assert ev["whole_bytes"] == model
    assert ev["twice"] and all(m.startswith("model.blocks.0.") for m in ev["twice"]), ev["twice"]
    assert f["modules"] == ev["twice"] and "held twice, whole and sharded" in f["detail"]
    assert "fully_shard keeps the parameters it was given whole until it returns" in f["detail"]
    assert 'torch.device("meta")' in f["fix"] and "configure_model()" in f["fix"]
    assert "auto-wrap" not in f["fix"]
    for peer in ev["peers"]:  # a rank that got past fully_shard holds its half
        assert peer["rank"] != oom["rank"] and peer["param_bytes"] * 2 == pytest.approx(model, rel=0.01)
    lines = run.output
    assert f"Rank {oom['rank']} ran out of memory on cpu during setup in fully_shard" in lines, lines
    assert "[sharding-transient-at-setup]" in lines and "placement-imbalance" not in lines, lines


def test_a_run_that_ran_out_where_the_plan_said_is_as_planned(runs: dict[str, RealRun]) -> None:
    run = runs[IN_FULLY_SHARD]
    plan = report_json(run)["plan"]
    assert (plan["fits"], plan["runs_out_at"]) == (False, "set-up")
    out = [r for r in plan["per_rank"] if r["out_of_memory"]]
    assert out and all((r["reached"], r["oom_as_planned"]) == ("set-up", True) for r in out), plan["per_rank"]
    assert "out of memory, as planned" in report(run.path)


def test_a_run_close_to_it_passes_set_up_and_is_not_said_to_run_out_as_planned(runs: dict[str, RealRun]) -> None:
    run = runs[PAST_SET_UP]
    data = report_json(run)
    assert data["oom"] is not None and data["oom"]["phase"] == "forward", run.describe()
    assert not {"sharding-transient-at-setup", "placement-imbalance"} & set(codes(data)), codes(data)
    assert "fully_shard" not in run.output and "placement-imbalance" not in run.output, run.output
    plan = data["plan"]
    assert (plan["fits"], plan["runs_out_at"]) == (False, "set-up")
    out = [r for r in plan["per_rank"] if r["out_of_memory"]]
    assert out and all((r["reached"], r["oom_as_planned"]) == ("forward", False) for r in out), plan["per_rank"]
    text = report(run.path)
    assert "out of memory in the first forward pass, planned at set-up" in text
    assert "as planned" not in text


def test_the_recorded_run_rank_0_caught_in_fully_shard_beside_rank_1_past_it(tmp_path: Path) -> None:
    (source,) = RECORDED.iterdir()
    run = Path(shutil.copytree(source, tmp_path / source.name))
    data = json_report(run)
    assert codes(data) == ["sharding-transient-at-setup"], [(f["code"], f["title"]) for f in data["findings"]]
    f = _finding(data, "sharding-transient-at-setup")
    ev = f["evidence"]
    model = data["model"]["bytes"]
    assert ev["oom"]["rank"] == 0 and ev["whole_bytes"] == model
    assert ev["twice"] == ["model.blocks.0.norm", "model.blocks.0.fc1"] and ev["twice_bytes"] == 8_404_992
    assert ev["peers"] == [{"rank": 1, "param_bytes": model // 2}]
    assert "Past fully_shard, rank 1 holds 68.1 MiB of the model's 136 MiB" in f["detail"]
    plan = data["plan"]
    assert (plan["fits"], plan["runs_out_at"]) == (False, "backward")
    ranks = {r["rank"]: (r["reached"], r["out_of_memory"], r["oom_as_planned"]) for r in plan["per_rank"]}
    assert ranks == {0: ("set-up", True, False), 1: ("set-up", False, None)}
    text = report(run)
    assert "out of memory at set-up, planned in the first backward pass" in text and "as planned" not in text
    assert "placement-imbalance" not in text and "shard what the heavy side holds whole" not in text
    lines = io.StringIO()
    follow(RunDirectory(run), lines)
    said = lines.getvalue()
    assert "Rank 0 ran out of memory on cpu during setup in fully_shard, asking for 4 MiB" in said
    assert "why: Rank 0 ran out of memory in fully_shard at set-up" in said and "[sharding-transient-at-setup]" in said
    assert "placement-imbalance" not in said


def test_without_the_snapshot_at_the_oom_nothing_is_claimed_and_no_fsdp2_user_is_told_to_shard(tmp_path: Path) -> None:
    """The same recording with rank 0's shards snapshot at the OOM taken out (a probe that could not read
    the model then): the transient is not claimed, the ranks are still not compared, and the OOM's own
    finding does not ask an FSDP2 user to shard the model or a CPU run to offload."""
    (source,) = RECORDED.iterdir()
    run = Path(shutil.copytree(source, tmp_path / source.name))
    events = run / "events" / "rank-0.jsonl"
    kept = [line for line in events.read_text().splitlines(keepends=True)
            if not ('"kind":"shards"' in line and '"stage":"oom"' in line)]
    events.write_text("".join(kept))
    data = json_report(run)
    assert codes(data) == ["oom"], [(f["code"], f["title"]) for f in data["findings"]]
    fix = _finding(data, "oom")["fix"]
    assert 'torch.device("meta")' in fix and "auto-wrap" not in fix and "offload" not in fix


def test_parameters_gathered_for_compute_at_an_oom_are_not_a_ranks_share() -> None:
    """Both ranks of an FSDP2 run ran out in forward; rank 0's snapshot at its OOM caught block ``a``
    gathered whole (a moment of compute), rank 1's caught it sharded: their shares are equal."""
    mib = 1 << 20
    tree = Tree(tree_id=0, names=["", "a", "b"], parents=[-1, 0, 0], types=[0, 1, 1], type_names=["Net", "Block"],
                params=[0, 64 * mib, 64 * mib], bytes=[0, 256 * mib, 256 * mib])
    events: list[Event] = [stamp(tree, 0, 0.0)]
    for rank, (a_bytes, a_state) in enumerate(((256 * mib, 1), (128 * mib, 0))):
        events += [
            stamp(Hello(pid=4_194_401 + rank, world_size=2, device="cpu", engine="fsdp2"), rank, 0.1),
            stamp(Oom(phase="forward", step=1, device="cpu", requested_bytes=128 * mib), rank, 1.0),
            stamp(Shards(tree_id=0, engine="fsdp2", stage="oom", devices=["cpu"], states=["sharded", "gathered"],
                         bytes=[0, a_bytes, 128 * mib], device=[-1, 0, 0], state=[-1, a_state, 0],
                         unit=[-1, -1, -1]), rank, 1.1),
        ]
    run = RunModel.of(fold(events))
    assert [r.param_bytes for r in run.ranks] == [384 * mib, 256 * mib]  # what the snapshots say they held
    assert "placement-imbalance" not in [f.code for f in diagnose(run)]
