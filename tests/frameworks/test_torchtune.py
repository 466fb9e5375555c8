"""torchtune's ``full_finetune_distributed`` (FSDP2) with its ``llama3_2/1B_full`` config, on two CPU processes.

``tune run --nproc_per_node 2`` starts the recipe, unchanged, through
``torchtune_cpu.py`` (the two CPU changes it needs, listed there; placed in
the working directory as a custom recipe), with the shipped config and
command-line overrides: the CPU and fp32, a seed, and a tiny Llama 3.2 built
by torchtune's own ``llama3_2`` builder in place of the 1B one.  Its
checkpoint (Hugging Face format), tokenizer and Alpaca data are made here
(``torchtune_inputs.py``).  The recipe builds the model on the meta device,
calls ``fully_shard`` on each ``layers.i`` and then on the root (which keeps
the embeddings, tied to the output, and the final norm), then loads the
checkpoint into the shards.  Each command runs once (module fixtures); the
tests read what it left.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

from tests.frameworks.environments import Environment
from tests.frameworks.figures import (
    FP32,
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
from tests.frameworks.torchtune_inputs import TINY_LLAMA
from tests.support.distributed import free_port

HERE = Path(__file__).parent
RECIPE = HERE / "torchtune_cpu.py"
INPUTS = HERE / "torchtune_inputs.py"
CONFIG = "llama3_2/1B_full"
STEPS = 3
BATCH = 2
SEQUENCE = 128
LOGGED_STEP = re.compile(r"\d+\|(\d+)\|Loss: ([0-9.]+)")
"""The recipe's progress bar on rank 0: ``epoch|step|Loss: value``."""


def finish(output: str) -> Finish | None:
    found = LOGGED_STEP.findall(output)
    return Finish(int(found[-1][0]), found[-1][1]) if found else None


def tune_run(space: Workspace, processes: int, tag: str, *overrides: str) -> list[str]:
    """``tune run`` with the shipped config, the CPU, a seed, the tiny model and the inputs made here."""
    inputs = space.workdir / "inputs"
    return [
        "tune", "run", "--nproc_per_node", str(processes), "--master_port", str(free_port()),
        RECIPE.stem, "--config", CONFIG,
        f"output_dir={space.workdir / f'out-{tag}'}", "device=cpu", "dtype=fp32", "seed=0",
        f"tokenizer.path={inputs / 'tokenizer.model'}", f"tokenizer.special_tokens_path={inputs / 'tokenizer.json'}",
        f"tokenizer.max_seq_len={SEQUENCE}", "dataset.source=json", f"dataset.data_files={inputs / 'alpaca.json'}",
        "model._component_=torchtune.models.llama3_2.llama3_2", *(f"model.{k}={v}" for k, v in TINY_LLAMA.items()),
        f"checkpointer.checkpoint_dir={inputs / 'model'}", f"batch_size={BATCH}", "gradient_accumulation_steps=1",
        f"max_steps_per_epoch={STEPS}", *overrides,
    ]


@pytest.fixture(scope="module")
def space(torchtune_env: Environment, tmp_path_factory: pytest.TempPathFactory) -> Workspace:
    workspace = Workspace(torchtune_env, tmp_path_factory.mktemp("torchtune"))
    shutil.copy(RECIPE, workspace.workdir / RECIPE.name)
    made = workspace.run([str(torchtune_env.python), str(INPUTS), "prepare", "inputs"], workspace.workdir / "runs")
    assert made.code == 0, made.output
    return workspace


@pytest.fixture(scope="module")
def model(space: Workspace) -> Inventory:
    return read_inventory(space.env.python, [str(INPUTS), "inventory"], space.workdir)


@pytest.fixture(scope="module")
def trained(space: Workspace) -> Ended:
    return alone(space, tune_run(space, 2, "alone"), "alone")


@pytest.fixture(scope="module")
def probed(space: Workspace) -> ShardtopRun:
    return under_run(space, tune_run(space, 2, "run"), "run")


@pytest.fixture(scope="module")
def stepped_in_backward(space: Workspace) -> ShardtopRun:
    return under_run(space, tune_run(space, 2, "in-backward", "optimizer_in_bwd=True"), "in-backward")


@pytest.fixture(scope="module")
def rehearsal(space: Workspace) -> ShardtopRun:
    return rehearsed(space, tune_run(space, 8, "rehearse"), "rehearse")


@pytest.fixture(scope="module")
def plan(space: Workspace) -> Plan:
    return planned(space, tune_run(space, 2, "plan"), "plan")


def test_torchtune_trains_its_recipe_on_two_cpu_processes(trained: Ended) -> None:
    assert trained.code == 0 or torn_down_by_gloo(trained, ""), trained.output[-6000:]
    ended = finish(trained.output)
    assert ended is not None and ended.steps == STEPS, trained.output[-6000:]


def test_under_shardtop_run_it_ends_as_it_does_alone(trained: Ended, probed: ShardtopRun) -> None:
    assert_ended_alike(trained, probed, finish)


def test_each_rank_holds_half_of_every_parameter(probed: ShardtopRun, model: Inventory) -> None:
    report = probed.report
    assert report, probed.describe()
    assert report["engine"] == "fsdp2"
    assert report["step"] == STEPS
    assert report["model"]["params"] == model.params
    assert report_params(report) == model.params_by_module
    for rank in (0, 1):
        expected = fsdp2_bytes(model, 2, rank)
        assert held_by(report, rank) == expected, f"rank {rank}"
        assert rank_entry(report, rank)["param_bytes"] == sum(expected.values()), f"rank {rank}"


def test_every_fully_shard_call_is_a_unit(probed: ShardtopRun) -> None:
    """Each block, then the root, which holds the embeddings (tied to the output) and the final norm."""
    report = probed.report
    assert report, probed.describe()
    expected = {"", *(f"layers.{i}" for i in range(TINY_LLAMA["num_layers"]))}
    assert units(report) == dict.fromkeys(expected, "fsdp2"), f"info: {report['info']}"
    assert report["info"].get("root_wrapped") is True, f"info: {report['info']}"


def test_with_the_optimizer_in_backward_each_rank_holds_its_half_and_every_optimizers_state(
    stepped_in_backward: ShardtopRun, model: Inventory
) -> None:
    """``optimizer_in_bwd=True``: an AdamW per parameter, stepped as each gradient arrives.  Each backward is
    one step, and each rank holds half of every parameter and AdamW's two moments of it (and a step count
    per parameter), as when the recipe steps one optimizer after backward."""
    run = stepped_in_backward
    assert run.ended.code == 0 or torn_down_by_gloo(run.ended, run.command_log()), run.describe()
    report = run.report
    assert report["step"] == STEPS
    tensors = sum(len(shapes) for shapes in model.shapes.values())
    for rank in (0, 1):
        entry = rank_entry(report, rank)
        held = sum(fsdp2_bytes(model, 2, rank).values())
        assert entry["param_bytes"] == held, f"rank {rank}"
        assert entry["optim_bytes"] == 2 * held + tensors * FP32, f"rank {rank}"


def test_rehearsal_of_the_first_and_last_of_eight_ranks(rehearsal: ShardtopRun, model: Inventory) -> None:
    assert rehearsal.ended.code == 0, rehearsal.describe()
    report = rehearsal.report
    assert report["rehearsal"]["world_size"] == 8 and report["rehearsal"]["ranks"] == [0, 7]
    assert report["engine"] == "fsdp2"
    assert report["step"] == STEPS
    for rank in (0, 7):
        entry = rank_entry(report, rank)
        assert entry["status"] == "finished", entry["status_detail"]
        expected = fsdp2_bytes(model, 8, rank)
        assert held_by(report, rank) == expected, f"rank {rank}"
        assert entry["param_bytes"] == sum(expected.values())


def test_plan_of_eight_ranks_shards_what_was_never_built_whole(plan: Plan, model: Inventory) -> None:
    """The recipe builds the model on the meta device and shards it before it loads the checkpoint."""
    assert plan.ended.code == 0, plan.describe()
    assert "could not trace" not in plan.stderr, plan.describe()
    assert plan.plan is not None
    assert plan.plan["model"]["params"] == model.params
    assert plan.plan["model"]["batch_size"] == BATCH
    option = plan.as_run()
    assert option["engine"] == "fsdp2"
    assert option["per_rank"]["params"] == model.bytes // 8
    assert option["built_whole"] is False, option["strategy"]
    assert option["peak_phase"] != "set-up", option["note"]
