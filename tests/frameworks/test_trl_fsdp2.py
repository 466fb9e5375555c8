"""TRL's ``SFTTrainer`` under ``accelerate launch`` with TRL's own ``fsdp2.yaml``, on CPU.

accelerate runs its FSDP plugin only on accelerator devices: on CPU processes
it trains with DDP (``DistributedType.MULTI_CPU``) whatever the file asks, and
says so nowhere a user would look.  The config file is the one TRL ships,
used as it is.  Each command runs once (module fixtures); the tests read what
it left.
"""

from __future__ import annotations

import pytest

from tests.frameworks.environments import Environment
from tests.frameworks.figures import Inventory, held_by, rank_entry, read_inventory, report_params, whole_bytes
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


def fsdp2(env: Environment, processes: int) -> list[str]:
    return accelerate_launch(env, "fsdp2.yaml", processes)


@pytest.fixture(scope="module")
def space(trl_env: Environment, tmp_path_factory: pytest.TempPathFactory) -> Workspace:
    return Workspace(trl_env, tmp_path_factory.mktemp("trl-fsdp2"))


@pytest.fixture(scope="module")
def model(space: Workspace) -> Inventory:
    return read_inventory(space.env.python, [str(SCRIPT), "--inventory"], space.workdir)


@pytest.fixture(scope="module")
def trained(space: Workspace) -> Ended:
    return alone(space, fsdp2(space.env, 2), "alone")


@pytest.fixture(scope="module")
def probed(space: Workspace) -> ShardtopRun:
    return under_run(space, fsdp2(space.env, 2), "run")


@pytest.fixture(scope="module")
def rehearsal(space: Workspace) -> ShardtopRun:
    return rehearsed(space, fsdp2(space.env, 8), "rehearse")


@pytest.fixture(scope="module")
def plan(space: Workspace) -> Plan:
    return planned(space, fsdp2(space.env, 2), "plan")


def test_accelerate_trains_ddp_on_cpu_with_the_fsdp2_config(trained: Ended) -> None:
    assert trained.code == 0 or torn_down_by_gloo(trained, ""), trained.output[-6000:]
    ended = finish(trained.output)
    assert ended is not None and ended.steps == STEPS, trained.output[-6000:]
    assert distributed_type(trained.output) == "MULTI_CPU"


def test_under_shardtop_run_it_ends_as_it_does_alone(trained: Ended, probed: ShardtopRun) -> None:
    assert_ended_alike(trained, probed, finish)


def test_each_rank_holds_the_whole_model(probed: ShardtopRun, model: Inventory) -> None:
    report = probed.report
    assert report, probed.describe()
    assert report["engine"] == "ddp"
    assert report_params(report) == model.params_by_module
    for rank in (0, 1):
        assert held_by(report, rank) == whole_bytes(model), f"rank {rank}"
        assert rank_entry(report, rank)["param_bytes"] == model.bytes, f"rank {rank}"


def test_the_report_says_fsdp_was_asked_for_and_ddp_ran(probed: ShardtopRun) -> None:
    report = probed.report
    assert report, probed.describe()
    said = "\n".join(f"{f['title']} {f['detail']}" for f in report["findings"])
    assert "FSDP" in said and "DDP" in said, f"findings: {[f['code'] for f in report['findings']]}\n{said}"


def test_rehearsal_of_the_first_and_last_of_eight_ranks(rehearsal: ShardtopRun, model: Inventory) -> None:
    assert rehearsal.ended.code == 0, rehearsal.describe()
    report = rehearsal.report
    assert report["rehearsal"]["ranks"] == [0, 7] and report["step"] == STEPS
    for rank in (0, 7):
        assert rank_entry(report, rank)["status"] == "finished"
        assert held_by(report, rank) == whole_bytes(model), f"rank {rank}"


def test_plan_of_eight_ranks(plan: Plan, model: Inventory) -> None:
    assert plan.ended.code == 0, plan.describe()
    assert "could not trace" not in plan.stderr, plan.describe()
    assert plan.plan is not None
    assert plan.plan["model"]["params"] == model.params
    assert plan.plan["model"]["batch_size"] == BATCH
    assert plan.as_run()["per_rank"]["activations"] > 0
