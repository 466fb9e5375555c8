"""``shardtop rehearse`` as a user types it: bad input refused with exit code 2 and nothing made, a preset
rehearsed rank by rank on CPU processes, and several job sizes tabulated."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from shardtop.config import ConfigError
from shardtop.inject.rehearsal import one_device_per_node
from shardtop.inject.rehearsal_env import Rehearsed, parse, reassert
from shardtop.rehearse.spec import RehearsalSpec, parse_settings
from tests.support.cli import shardtop

CPU = {"CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": "1"}


# -- what was asked, pure ---------------------------------------------------------------------------


def test_ranks_by_number_last_and_all_each_once_in_the_order_asked() -> None:
    spec, rest = parse_settings(["zero3-linear", "devices=8", "rank=last,0,7", "max_steps=3"])
    assert rest == ["zero3-linear", "max_steps=3"]
    assert spec.ranks_of(8) == (7, 0)
    assert RehearsalSpec(worlds=(4,), ranks=("all",)).ranks_of(4) == (0, 1, 2, 3)
    assert parse_settings(["devices=2,4,8,4"])[0].worlds == (2, 4, 8)


@pytest.mark.parametrize(
    ("settings", "said"),
    [
        (["zero3-linear"], "how many GPUs"),
        (["devices=0"], "devices=0"),
        (["devices=2,x"], "devices=2,x"),
        (["devices=8", "rank=8"], "ranks 0 to 7"),
        (["devices=2,8", "rank=5"], "devices=2 has ranks 0 to 1"),
        (["devices=8", "rank=first"], "rank=first"),
    ],
)
def test_a_rehearsal_that_cannot_be_is_refused_before_anything_starts(settings: list[str], said: str) -> None:
    with pytest.raises(ConfigError, match=said):
        parse_settings(settings)


def test_a_rehearsed_rank_is_the_only_process_of_its_node_on_the_one_device() -> None:
    env = Rehearsed(5, 8).environment(port=1234)
    assert (env["RANK"], env["WORLD_SIZE"], env["LOCAL_RANK"], env["NODE_RANK"]) == ("5", "8", "0", "5")
    assert parse("5/8") is not None and parse("8/8") is None and parse("x") is None
    launched = {"SHARDTOP_REHEARSE": "5/8", "RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "MASTER_PORT": "4321"}
    reassert(launched)  # a launcher set its own: the rehearsed rank's comes back, the launcher's port stays
    assert (launched["RANK"], launched["WORLD_SIZE"], launched["MASTER_PORT"]) == ("5", "8", "4321")


def test_lightning_is_told_one_device_per_node_and_a_self_sized_mesh_keeps_the_jobs_shape() -> None:
    from lightning.pytorch.strategies import ModelParallelStrategy

    strategy = ModelParallelStrategy()  # data and tensor parallel sizes "auto": sized from devices and nodes
    kwargs = one_device_per_node({"devices": 4, "num_nodes": 2, "strategy": strategy, "max_steps": 3}, world_size=8)
    assert (kwargs["devices"], kwargs["num_nodes"], kwargs["max_steps"]) == (1, 8, 3)
    assert (strategy._data_parallel_size, strategy._tensor_parallel_size) == (2, 4)


# -- the command, as typed --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["fsdp2-mlp"], "how many GPUs"),
        (["no-such-preset", "devices=2"], "no-such-preset"),
        (["fsdp2-mlp", "devices=2", "model.no_such_key=1"], "unknown key"),
        (["fsdp2-mlp", "devices=2", "rank=2"], "ranks 0 to 1"),
        (["manual-placement", "devices=2"], "no rank to rehearse"),
        (["fsdp2-mlp", "devices=2", "gpu=lots"], "gpu=lots"),
        (["devices=2", "max_steps=3", "--", "python", "train.py"], "before --"),
    ],
)
def test_bad_input_says_what_to_type_and_makes_no_run(args: list[str], said: str, runs_dir: Path) -> None:
    done = shardtop("rehearse", "--headless", *args, runs_dir=runs_dir, env=CPU)
    assert done.returncode == 2, done.stdout + done.stderr
    assert said in done.stderr
    assert "Traceback" not in done.stderr
    assert not runs_dir.exists() or not any(runs_dir.iterdir())


def test_a_preset_rehearsed_as_its_first_and_last_rank_of_four_holds_each_ranks_quarter(runs_dir: Path) -> None:
    done = shardtop("rehearse", "fsdp2-mlp", "devices=4", "rank=0,last", "max_steps=2", "--headless",
                    runs_dir=runs_dir, env=CPU, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "rank 3 of 4 up" in done.stdout
    listing = shardtop("runs", runs_dir=runs_dir)
    assert "2/4 rehearsed" in listing.stdout
    report = json.loads(shardtop("report", "--format", "json", runs_dir=runs_dir).stdout)
    assert report["world_size"] == 4 and report["rehearsal"]["ranks"] == [0, 3]
    assert [r["status"] for r in report["ranks"]] == ["finished", "finished"]
    for module in report["modules"]:
        if module["path"].count(".") == 1 and module["bytes"]:  # model.embed, model.blocks, model.head
            for held in module["ranks"]:
                assert held["state"] == "sharded"
                assert held["bytes"] == module["bytes"] // 4, module["path"]


def test_several_job_sizes_are_rehearsed_in_turn_and_tabulated(runs_dir: Path) -> None:
    done = shardtop("rehearse", "fsdp2-mlp", "devices=2,4", "rank=last", "max_steps=1", "--headless",
                    runs_dir=runs_dir, env=CPU, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    table = done.stdout[done.stdout.index("devices  rank"):].splitlines()
    assert [line.split()[:3] for line in table[1:3]] == [["2", "1", "finished"], ["4", "3", "finished"]]
    assert table[3] == "smallest job that fits: devices=2"
    assert len(list(runs_dir.iterdir())) == 2
