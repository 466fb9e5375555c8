"""TRL's ``SFTTrainer`` under ``accelerate launch`` with TRL's own ``zero3.yaml`` (DeepSpeed ZeRO-3), on CPU.

The config file is the one TRL ships; on CPU a user overrides its bf16 with
``--mixed_precision no`` and sets ``DS_ACCELERATOR=cpu``.  The script
(``trl_sft.py``) builds a two-layer Llama from its config after the
``SFTConfig``, so ZeRO-3 builds it partitioned; its MLP matrices are over
DeepSpeed's default persistence threshold, and every other parameter is also
kept whole on every rank, beside its part.  Each command runs once (module fixtures) and the tests
read what it left, as a user would: the command's output, ``shardtop report
--format json`` and ``shardtop plan --format json``.
"""

from __future__ import annotations

import pytest

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
from tests.frameworks.trl_commands import BATCH, SCRIPT, STEPS, accelerate_launch, distributed_type, finish


def zero3(env: Environment, processes: int) -> list[str]:
    return accelerate_launch(env, "zero3.yaml", processes, "--mixed_precision", "no")


@pytest.fixture(scope="module")
def space(trl_env: Environment, tmp_path_factory: pytest.TempPathFactory) -> Workspace:
    return Workspace(trl_env, tmp_path_factory.mktemp("trl-zero3"), (("DS_ACCELERATOR", "cpu"),))


@pytest.fixture(scope="module")
def model(space: Workspace) -> Inventory:
    return read_inventory(space.env.python, [str(SCRIPT), "--inventory"], space.workdir)


@pytest.fixture(scope="module")
def threshold(model: Inventory) -> int:
    return int(model.extra["persistence_threshold"])


@pytest.fixture(scope="module")
def trained(space: Workspace) -> Ended:
    return alone(space, zero3(space.env, 2), "alone")


@pytest.fixture(scope="module")
def probed(space: Workspace) -> ShardtopRun:
    return under_run(space, zero3(space.env, 2), "run")


@pytest.fixture(scope="module")
def rehearsal(space: Workspace) -> ShardtopRun:
    return rehearsed(space, zero3(space.env, 8), "rehearse")


@pytest.fixture(scope="module")
def plan(space: Workspace) -> Plan:
    return planned(space, zero3(space.env, 2), "plan")


def test_trl_trains_with_zero3_on_two_cpu_processes(trained: Ended) -> None:
    assert trained.code == 0 or torn_down_by_gloo(trained, ""), trained.output[-6000:]
    ended = finish(trained.output)
    assert ended is not None and ended.steps == STEPS, trained.output[-6000:]
    assert distributed_type(trained.output) == "DEEPSPEED"


def test_under_shardtop_run_it_ends_as_it_does_alone(trained: Ended, probed: ShardtopRun) -> None:
    assert_ended_alike(trained, probed, finish)


def test_the_report_counts_the_model_its_config_builds(probed: ShardtopRun, model: Inventory) -> None:
    report = probed.report
    assert report, probed.describe()
    assert report["engine"] == "zero3", probed.describe()
    assert report["model"]["params"] == model.params
    assert report_params(report) == model.params_by_module


def test_each_rank_holds_its_partitions_and_the_persistent_parameters(
    probed: ShardtopRun, model: Inventory, threshold: int
) -> None:
    report = probed.report
    assert report, probed.describe()
    for rank in (0, 1):
        expected = zero3_bytes(model, 2, rank, threshold)
        assert held_by(report, rank) == expected, f"rank {rank}"
        assert rank_entry(report, rank)["param_bytes"] == sum(expected.values()), f"rank {rank}"


def gathered_at_most(model: Inventory, threshold: int) -> int:
    """The bytes of the partitioned parameters whole: what ZeRO-3 can hold gathered, beside the parts, at once."""
    return sum(numel(shape) for shapes in model.shapes.values() for shape in shapes if numel(shape) > threshold) * FP32


def test_memory_by_kind_agrees_with_each_ranks_totals(probed: ShardtopRun, model: Inventory, threshold: int) -> None:
    """The rank's parameters and gradients, as its memory split counts them and as its totals count them.

    The split is the latest census, taken in whichever phase its time came: after the backward (the
    optimizer's step, the step's end) ZeRO-3 holds only the parts and the persistent parameters, and the
    split must count exactly the totals; in the forward and the backward it also holds gathered copies
    (prefetched, or re-gathered by the checkpointed layers' recompute), at most the partitioned
    parameters whole, which the split counts as parameters too."""
    report = probed.report
    assert report, probed.describe()
    gathered = gathered_at_most(model, threshold)
    for entry in report["ranks"]:
        split = entry["memory_now"]
        assert split is not None, f"rank {entry['rank']}: no memory split"
        kinds = split["by_kind"]
        said = (f"rank {entry['rank']}, {split['phase']} of step {split['step']}: by kind params {kinds['params']}, "
                f"grads {kinds['grads']}; the rank's totals params {entry['param_bytes']}, grads {entry['grad_bytes']}")
        assert kinds["grads"] == entry["grad_bytes"], said
        extra = kinds["params"] - entry["param_bytes"]
        if split["phase"] in ("forward", "backward"):
            assert 0 <= extra <= gathered, f"{said}; at most {gathered} gathered"
        else:
            assert extra == 0, said


def test_rehearsal_of_the_first_and_last_of_eight_ranks(
    rehearsal: ShardtopRun, model: Inventory, threshold: int
) -> None:
    assert rehearsal.ended.code == 0, rehearsal.describe()
    report = rehearsal.report
    assert report["rehearsal"]["world_size"] == 8 and report["rehearsal"]["ranks"] == [0, 7]
    assert report["step"] == STEPS
    for rank in (0, 7):
        entry = rank_entry(report, rank)
        assert entry["status"] == "finished", entry["status_detail"]
        expected = zero3_bytes(model, 8, rank, threshold)
        assert held_by(report, rank) == expected, f"rank {rank}"
        assert entry["param_bytes"] == sum(expected.values()), f"rank {rank}"


def test_plan_of_eight_ranks(plan: Plan, model: Inventory, threshold: int) -> None:
    assert plan.ended.code == 0, plan.describe()
    assert "could not trace" not in plan.stderr, plan.describe()
    assert plan.plan is not None
    assert plan.plan["model"]["params"] == model.params
    assert plan.plan["model"]["batch_size"] == BATCH, plan.describe()
    option = plan.as_run()
    assert option["engine"] == "zero3"
    assert option["per_rank"]["params"] == sum(zero3_bytes(model, 8, 0, threshold).values())
    assert option["per_rank"]["activations"] > 0, plan.describe()
