"""axolotl's ``axolotl.cli.train`` with axolotl's own ``deepspeed_configs/zero3.json`` (DeepSpeed ZeRO-3), on CPU.

``axolotl train config.yml --launcher torchrun -- --nproc_per_node 2`` runs
``torchrun --nproc_per_node 2 -m axolotl.cli.train config.yml``; here the
module runs, unchanged, through ``axolotl_cpu.py`` (the one CPU change it
needs, listed there; placed in the working directory), with
``DS_ACCELERATOR=cpu`` and axolotl's telemetry off (``AXOLOTL_DO_NOT_TRACK``:
nothing leaves the machine).  The config (``axolotl_inputs.py``) is a full
fine-tune in the shape of axolotl's ``examples/llama-3/fft-8b.yaml``, in fp32
with SDPA attention, on a two-layer Llama built from its config and saved as
``base_model``, a word-level tokenizer saved beside it, and an Alpaca file.
Under ZeRO-3, transformers builds the model partitioned (``zero.Init``), and
``"auto"`` makes the persistence threshold ten times the hidden size: the
norms stay whole beside their parts, every other parameter is only
partitioned.  Each command runs once (module fixtures); the tests read what
it left.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

from tests.frameworks.axolotl_inputs import BATCH, STEPS
from tests.frameworks.environments import Environment
from tests.frameworks.figures import (
    FP32,
    Inventory,
    held_by,
    numel,
    rank_entry,
    read_inventory,
    report_params,
    zero3_bytes,
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
SHIM = HERE / "axolotl_cpu.py"
INPUTS = HERE / "axolotl_inputs.py"
LOGGED_STEP = re.compile(r"\{'loss': '([0-9.]+)'")
"""The trainer's log on rank 0, one per step (``logging_steps: 1``): ``{'loss': '3.419', 'grad_norm': ...}``."""


def finish(output: str) -> Finish | None:
    found = LOGGED_STEP.findall(output)
    return Finish(len(found), found[-1]) if found else None


def axolotl_train(space: Workspace, processes: int, tag: str) -> list[str]:
    """``torchrun -m axolotl.cli.train config.yml`` through the shim, with its outputs kept apart per command."""
    return [
        "torchrun", "--nproc_per_node", str(processes), "--master_port", str(free_port()), SHIM.name,
        "config.yml", f"--output_dir=./out-{tag}", f"--dataset_prepared_path=./prepared-{tag}",
    ]


@pytest.fixture(scope="module")
def space(axolotl_env: Environment, tmp_path_factory: pytest.TempPathFactory) -> Workspace:
    workspace = Workspace(axolotl_env, tmp_path_factory.mktemp("axolotl"),
                          (("DS_ACCELERATOR", "cpu"), ("AXOLOTL_DO_NOT_TRACK", "1")))
    shutil.copy(SHIM, workspace.workdir / SHIM.name)
    made = workspace.run([str(axolotl_env.python), str(INPUTS), "prepare", str(workspace.workdir)],
                         workspace.workdir / "runs")
    assert made.code == 0, made.output
    return workspace


@pytest.fixture(scope="module")
def model(space: Workspace) -> Inventory:
    return read_inventory(space.env.python, [str(INPUTS), "inventory"], space.workdir)


@pytest.fixture(scope="module")
def threshold(model: Inventory) -> int:
    return int(model.extra["persistence_threshold"])


@pytest.fixture(scope="module")
def trained(space: Workspace) -> Ended:
    return alone(space, axolotl_train(space, 2, "alone"), "alone")


@pytest.fixture(scope="module")
def probed(space: Workspace) -> ShardtopRun:
    return under_run(space, axolotl_train(space, 2, "run"), "run")


@pytest.fixture(scope="module")
def rehearsal(space: Workspace) -> ShardtopRun:
    return rehearsed(space, axolotl_train(space, 8, "rehearse"), "rehearse")


@pytest.fixture(scope="module")
def plan(space: Workspace) -> Plan:
    return planned(space, axolotl_train(space, 2, "plan"), "plan")


def test_axolotl_trains_with_zero3_on_two_cpu_processes(trained: Ended) -> None:
    assert trained.code == 0 or torn_down_by_gloo(trained, ""), trained.output[-6000:]
    ended = finish(trained.output)
    assert ended is not None and ended.steps == STEPS, trained.output[-6000:]


def test_under_shardtop_run_it_ends_as_it_does_alone(trained: Ended, probed: ShardtopRun) -> None:
    assert_ended_alike(trained, probed, finish)


def test_the_report_counts_the_model_saved_as_base_model(probed: ShardtopRun, model: Inventory) -> None:
    report = probed.report
    assert report, probed.describe()
    assert report["engine"] == "zero3", probed.describe()
    assert report["step"] == STEPS
    assert report["model"]["params"] == model.params
    assert report_params(report) == model.params_by_module
    assert report["info"]["zero_init"] is True, report["info"]
    assert report["info"]["persistence_threshold"] == model.extra["persistence_threshold"], report["info"]


def test_each_rank_holds_its_partitions_and_the_whole_norms(
    probed: ShardtopRun, model: Inventory, threshold: int
) -> None:
    report = probed.report
    assert report, probed.describe()
    for rank in (0, 1):
        expected = zero3_bytes(model, 2, rank, threshold)
        assert held_by(report, rank) == expected, f"rank {rank}"
        assert rank_entry(report, rank)["param_bytes"] == sum(expected.values()), f"rank {rank}"


def test_rehearsal_of_the_first_and_last_of_eight_ranks(
    rehearsal: ShardtopRun, model: Inventory, threshold: int
) -> None:
    assert rehearsal.ended.code == 0, rehearsal.describe()
    report = rehearsal.report
    assert report["rehearsal"]["world_size"] == 8 and report["rehearsal"]["ranks"] == [0, 7]
    assert report["engine"] == "zero3"
    assert report["step"] == STEPS
    for rank in (0, 7):
        entry = rank_entry(report, rank)
        assert entry["status"] == "finished", entry["status_detail"]
        expected = zero3_bytes(model, 8, rank, threshold)
        assert held_by(report, rank) == expected, f"rank {rank}"
        assert entry["param_bytes"] == sum(expected.values()), f"rank {rank}"


def test_memory_by_kind_agrees_with_each_ranks_totals_and_the_gathered_embedding(
    probed: ShardtopRun, model: Inventory
) -> None:
    """The rank's parameters and gradients, as its memory split counts them and as its totals count them.

    The totals are what the rank holds at rest (its partitions and the persistent norms).  The split is of
    the moment it was taken, the optimizer phase of the last step: here ZeRO-3 leaves the embedding's
    weight whole from the forward until the optimizer step releases it (seen alone, on rank 0, before
    each of the three steps), and the split counts it whole beside its partition, as memory it is.
    """
    report = probed.report
    assert report, probed.describe()
    embedding = sum(numel(shape) for shape in model.shapes["model.embed_tokens"]) * FP32
    for entry in report["ranks"]:
        split = entry["memory_now"]
        assert split is not None, f"rank {entry['rank']}: no memory split"
        kinds = split["by_kind"]
        said = (f"rank {entry['rank']} in its {split['phase']} phase of step {split['step']}: by kind params "
                f"{kinds['params']}, grads {kinds['grads']}; the rank's totals params {entry['param_bytes']}, "
                f"grads {entry['grad_bytes']}")
        assert kinds["params"] - entry["param_bytes"] in (0, embedding), said
        assert kinds["grads"] == entry["grad_bytes"], said


def test_plan_of_eight_ranks(plan: Plan, model: Inventory) -> None:
    """The model is built inside ``zero.Init`` (partitioned as it is made), and traced at the batch it is given."""
    assert plan.ended.code == 0, plan.describe()
    assert "could not trace" not in plan.stderr, plan.describe()
    assert plan.plan is not None
    assert plan.plan["model"]["params"] == model.params
    assert plan.plan["model"]["batch_size"] == BATCH, plan.describe()
    option = plan.as_run()
    assert option["engine"] == "zero3"
    assert option["built_whole"] is False, option["strategy"]
    assert option["per_rank"]["activations"] > 0, plan.describe()


def test_plan_of_eight_ranks_keeps_whole_what_the_configs_threshold_keeps_whole(
    plan: Plan, model: Inventory, threshold: int
) -> None:
    assert plan.plan is not None, plan.describe()
    assert plan.as_run()["per_rank"]["params"] == sum(zero3_bytes(model, 8, 0, threshold).values())
