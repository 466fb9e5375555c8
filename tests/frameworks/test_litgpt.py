"""litgpt's ``finetune_full`` (Lightning Fabric's ``FSDPStrategy``: FSDP1, one unit per ``Block``) on CPU.

litgpt's own command line runs unchanged through ``litgpt_cpu.py`` (the CPU
changes it needs, listed there), on a checkpoint made here from
``litgpt.Config`` with seeded random weights and a word-level tokenizer, and
Alpaca-style rows (``litgpt_inputs.py``).  Fabric starts its own processes
(``--devices 2``).  Each command runs once (module fixtures); the tests read
what it left.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.frameworks.environments import Environment
from tests.frameworks.figures import (
    Inventory,
    fsdp1_rank_bytes,
    held_by,
    rank_entry,
    read_inventory,
    report_params,
    units,
    whole_bytes,
)
from tests.frameworks.runs import (
    Ended,
    Finish,
    Plan,
    ShardtopRun,
    Workspace,
    alone,
    assert_ended_alike,
    planned,
    rehearsed,
    torn_down_by_gloo,
    under_run,
)

HERE = Path(__file__).parent
LITGPT = HERE / "litgpt_cpu.py"
INPUTS = HERE / "litgpt_inputs.py"
STEPS = 3
MICRO_BATCH = 2
BLOCKS = ("transformer.h.0", "transformer.h.1")
LOGGED_STEP = re.compile(r"iter \d+ step (\d+) \| loss train: ([0-9.]+)")
NAMED_LOG = re.compile(r"logs/[\w.-]+\.log")


def finish(output: str) -> Finish | None:
    found = LOGGED_STEP.findall(output)
    return Finish(int(found[-1][0]), found[-1][1]) if found else None


def finetune(space: Workspace, devices: int, tag: str, checkpoint: str = "checkpoint") -> list[str]:
    """``litgpt finetune_full`` as its docs show it, with a global batch of one micro-batch per device."""
    inputs = space.workdir / "inputs"
    return [
        "python", str(LITGPT), "finetune_full", str(inputs / checkpoint), "--devices", str(devices),
        "--precision", "32-true", "--out_dir", str(space.workdir / f"out-{tag}"),
        "--data", "JSON", "--data.json_path", str(inputs / "train.json"), "--data.val_split_fraction", "0.1",
        "--data.num_workers", "0", "--train.max_steps", str(STEPS), "--train.micro_batch_size", str(MICRO_BATCH),
        "--train.global_batch_size", str(MICRO_BATCH * devices), "--train.lr_warmup_steps", "1",
        "--train.save_interval", "1000", "--eval.interval", "1000", "--eval.final_validation", "false",
        "--logger_name", "csv",
    ]


@pytest.fixture(scope="module")
def space(litgpt_env: Environment, tmp_path_factory: pytest.TempPathFactory) -> Workspace:
    workspace = Workspace(litgpt_env, tmp_path_factory.mktemp("litgpt"))
    made = workspace.run([str(litgpt_env.python), str(INPUTS), "prepare", "inputs"], workspace.workdir / "runs")
    assert made.code == 0, made.output
    return workspace


@pytest.fixture(scope="module")
def model(space: Workspace) -> Inventory:
    return read_inventory(space.env.python, [str(INPUTS), "inventory", "inputs"], space.workdir)


@pytest.fixture(scope="module")
def trained(space: Workspace) -> Ended:
    return alone(space, finetune(space, 2, "alone"), "alone")


@pytest.fixture(scope="module")
def probed(space: Workspace) -> ShardtopRun:
    return under_run(space, finetune(space, 2, "run"), "run")


@pytest.fixture(scope="module")
def rehearsal(space: Workspace) -> ShardtopRun:
    return rehearsed(space, finetune(space, 8, "rehearse"), "rehearse")


@pytest.fixture(scope="module")
def plan(space: Workspace) -> Plan:
    return planned(space, finetune(space, 2, "plan"), "plan")


def test_litgpt_finetunes_on_two_cpu_processes(trained: Ended) -> None:
    assert trained.code == 0 or torn_down_by_gloo(trained, ""), trained.output[-6000:]
    ended = finish(trained.output)
    assert ended is not None and ended.steps == STEPS, trained.output[-6000:]


def test_under_shardtop_run_it_ends_as_it_does_alone(trained: Ended, probed: ShardtopRun) -> None:
    assert_ended_alike(trained, probed, finish)


def test_each_rank_holds_half_of_each_units_flat_parameter(probed: ShardtopRun, model: Inventory) -> None:
    report = probed.report
    assert report, probed.describe()
    assert report["engine"] == "fsdp1"
    assert report["model"]["params"] == model.params
    assert report_params(report) == model.params_by_module
    assert units(report) == dict.fromkeys(("", *BLOCKS), "fsdp1")
    for rank in (0, 1):
        assert rank_entry(report, rank)["param_bytes"] == fsdp1_rank_bytes(model, list(BLOCKS), 2, rank)
    held = [held_by(report, rank) for rank in (0, 1)]
    assert {path: held[0][path] + held[1][path] for path in held[0]} == whole_bytes(model)


def test_rehearsal_of_the_first_and_last_of_eight_ranks(rehearsal: ShardtopRun, model: Inventory) -> None:
    assert rehearsal.ended.code == 0, rehearsal.describe()
    report = rehearsal.report
    assert report["rehearsal"]["world_size"] == 8 and report["rehearsal"]["ranks"] == [0, 7]
    assert report["step"] == STEPS
    for rank in (0, 7):
        entry = rank_entry(report, rank)
        assert entry["status"] == "finished", entry["status_detail"]
        assert entry["param_bytes"] == fsdp1_rank_bytes(model, list(BLOCKS), 8, rank), f"rank {rank}"


def test_a_failed_rehearsal_points_to_logs_that_exist(space: Workspace) -> None:
    """A checkpoint directory without weights: litgpt stops before any engine starts."""
    (space.workdir / "inputs" / "empty-checkpoint").mkdir(exist_ok=True)
    failed = rehearsed(space, finetune(space, 8, "failed", checkpoint="empty-checkpoint"), "rehearse-failed")
    assert failed.ended.code != 0, failed.describe()
    said = "\n".join(f"{f['detail']} {f['fix']}" for f in failed.report["findings"])
    named = NAMED_LOG.findall(said)
    assert named, said
    logs = sorted(str(p.relative_to(failed.run_dir)) for p in failed.run_dir.rglob("*.log"))
    assert [log for log in named if not (failed.run_dir / log).is_file()] == [], f"{said}\nthe run's logs: {logs}"


def test_plan_of_eight_ranks(plan: Plan, model: Inventory) -> None:
    assert plan.ended.code == 0, plan.describe()
    assert plan.plan is not None
    assert plan.plan["model"]["params"] == model.params
    assert plan.plan["model"]["batch_size"] == MICRO_BATCH
    option = plan.as_run()
    assert option["engine"] == "fsdp1"
    assert option["per_rank"]["params"] == fsdp1_rank_bytes(model, list(BLOCKS), 8, 0)
