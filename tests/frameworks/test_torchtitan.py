"""torchtitan's llama3 debug model, FSDP2, under ``torchrun`` on two CPU processes.

torchtitan's own trainer runs unchanged through ``torchtitan_cpu.py`` (the
few CPU changes it needs, listed there), with its own debug config: the model
built on the meta device, ``fully_shard`` on the embeddings, on ``[norm,
lm_head]`` together, on each of the six blocks (each wrapped first for
selective activation checkpointing, torchtitan's default) and on the root,
which owns no parameters, then materialised.  Its tokenizer and data are made
here (``torchtitan_inputs.py``).  Each command runs once (module fixtures);
the tests read what it left.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.frameworks.environments import Environment
from tests.frameworks.figures import (
    Inventory,
    fsdp2_bytes,
    held_by,
    rank_entry,
    read_inventory,
    report_params,
    units,
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
from tests.support.distributed import free_port

HERE = Path(__file__).parent
TRAINER = HERE / "torchtitan_cpu.py"
INPUTS = HERE / "torchtitan_inputs.py"
STEPS = 3
BATCH = 2
BLOCKS = 6
LOGGED_STEP = re.compile(r"step:\s+(\d+)\s+loss:\s+([0-9.]+)")


def finish(output: str) -> Finish | None:
    found = LOGGED_STEP.findall(output)
    return Finish(int(found[-1][0]), found[-1][1]) if found else None


def torchrun(space: Workspace, processes: int, tag: str, micro_steps: int = 1) -> list[str]:
    """torchtitan's debug config with a small batch; ``micro_steps`` batches accumulated into each step."""
    inputs = space.workdir / "inputs"
    return [
        "torchrun", "--nproc_per_node", str(processes), "--master_port", str(free_port()), str(TRAINER),
        "--module", "llama3", "--config", "llama3_debugmodel",
        "--hf-assets-path", str(inputs / "tokenizer"), "--dataloader.dataset-path", str(inputs / "data"),
        "--training.steps", str(STEPS), "--training.local-batch-size", str(BATCH), "--training.seq-len", "64",
        "--training.global-batch-size", str(BATCH * processes * micro_steps),
        "--parallelism.spmd-backend", "partial_dtensor", "--checkpoint.no-enable", "--validator.no-enable",
        "--debug.seed", "0", "--metrics.disable-color-printing", "--dump-folder", str(space.workdir / f"out-{tag}"),
    ]


@pytest.fixture(scope="module")
def space(torchtitan_env: Environment, tmp_path_factory: pytest.TempPathFactory) -> Workspace:
    workspace = Workspace(torchtitan_env, tmp_path_factory.mktemp("torchtitan"))
    made = workspace.run([str(torchtitan_env.python), str(INPUTS), "prepare", "inputs"], workspace.workdir / "runs")
    assert made.code == 0, made.output
    return workspace


@pytest.fixture(scope="module")
def model(space: Workspace) -> Inventory:
    return read_inventory(space.env.python, [str(INPUTS), "inventory"], space.workdir)


@pytest.fixture(scope="module")
def trained(space: Workspace) -> Ended:
    return alone(space, torchrun(space, 2, "alone"), "alone")


@pytest.fixture(scope="module")
def probed(space: Workspace) -> ShardtopRun:
    return under_run(space, torchrun(space, 2, "run"), "run")


@pytest.fixture(scope="module")
def accumulated(space: Workspace) -> ShardtopRun:
    return under_run(space, torchrun(space, 2, "accumulated", micro_steps=2), "accumulated")


@pytest.fixture(scope="module")
def rehearsal(space: Workspace) -> ShardtopRun:
    return rehearsed(space, torchrun(space, 8, "rehearse"), "rehearse")


@pytest.fixture(scope="module")
def plan(space: Workspace) -> Plan:
    return planned(space, torchrun(space, 2, "plan"), "plan")


def test_torchtitan_trains_its_debug_model_on_two_cpu_processes(trained: Ended) -> None:
    assert trained.code == 0 or torn_down_by_gloo(trained, ""), trained.output[-6000:]
    ended = finish(trained.output)
    assert ended is not None and ended.steps == STEPS, trained.output[-6000:]


def test_under_shardtop_run_it_ends_as_it_does_alone(trained: Ended, probed: ShardtopRun) -> None:
    assert_ended_alike(trained, probed, finish)


def test_each_rank_holds_half_of_every_parameter(probed: ShardtopRun, model: Inventory) -> None:
    report = probed.report
    assert report, probed.describe()
    assert report["engine"] == "fsdp2"
    assert report["model"]["params"] == model.params
    assert report_params(report) == model.params_by_module
    for rank in (0, 1):
        expected = fsdp2_bytes(model, 2, rank)
        assert held_by(report, rank) == expected, f"rank {rank}"
        assert rank_entry(report, rank)["param_bytes"] == sum(expected.values()) == model.bytes // 2


def test_every_fully_shard_call_is_a_unit(probed: ShardtopRun) -> None:
    """The blocks (checkpoint-wrapped first), the embeddings and ``[norm, lm_head]`` (one call over two modules)
    hold the parameters; the root was wrapped too, though it owns none."""
    report = probed.report
    assert report, probed.describe()
    expected = {"tok_embeddings", "norm", "lm_head", *(f"layers.{i}" for i in range(BLOCKS))}
    assert units(report) == dict.fromkeys(expected, "fsdp2"), f"info: {report['info']}"
    assert report["info"].get("root_wrapped") is True, f"info: {report['info']}"


def test_with_gradient_accumulation_each_rank_holds_half_of_the_gradients(
    accumulated: ShardtopRun, model: Inventory
) -> None:
    """torchtitan reduce-scatters every micro-batch's gradients: after a step each rank holds its half."""
    assert accumulated.ended.code == 0 or torn_down_by_gloo(accumulated.ended, accumulated.command_log()), (
        accumulated.describe())
    assert "gradient accumulation steps 2" in accumulated.command_log(), accumulated.describe()
    report = accumulated.report
    assert report["step"] == STEPS
    for rank in (0, 1):
        entry = rank_entry(report, rank)
        assert (entry["param_bytes"], entry["grad_bytes"]) == (model.bytes // 2, model.bytes // 2), f"rank {rank}"


def test_rehearsal_of_the_first_and_last_of_eight_ranks(rehearsal: ShardtopRun, model: Inventory) -> None:
    assert rehearsal.ended.code == 0, rehearsal.describe()
    report = rehearsal.report
    assert report["rehearsal"]["world_size"] == 8 and report["rehearsal"]["ranks"] == [0, 7]
    assert report["step"] == STEPS
    for rank in (0, 7):
        entry = rank_entry(report, rank)
        assert entry["status"] == "finished", entry["status_detail"]
        expected = fsdp2_bytes(model, 8, rank)
        assert held_by(report, rank) == expected, f"rank {rank}"
        assert entry["param_bytes"] == sum(expected.values()) == model.bytes // 8


def test_plan_of_eight_ranks_shards_what_was_never_built_whole(plan: Plan, model: Inventory) -> None:
    """torchtitan builds the model on the meta device and shards it before it materialises it."""
    assert plan.ended.code == 0, plan.describe()
    assert plan.plan is not None
    assert plan.plan["model"]["params"] == model.params
    assert plan.plan["model"]["batch_size"] == BATCH
    option = plan.as_run()
    assert option["engine"] == "fsdp2"
    assert option["per_rank"]["params"] == model.bytes // 8
    assert option["built_whole"] is False, option["strategy"]
    assert option["peak_phase"] != "set-up", option["note"]
