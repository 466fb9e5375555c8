"""An ``autograd.Function`` that reads an attribute of the parameter it saved, under shardtop's explained steps.

``saved_parameter.py`` is the pattern of TRL's chunked log-prob loss, Liger's
fused linear cross-entropy and bitsandbytes' 4-bit weights: the backward takes
the weight back from ``ctx.saved_tensors`` and reads what its engine or
library set on it (``ds_status`` under ZeRO-3, a ``quant_state``).  shardtop
explains the first steps of every run (the activations each module saved):
that must leave the ``Parameter`` the function gets back as it was.  Run in
TRL's environment (torch and DeepSpeed), two processes under ``torchrun``.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.frameworks.environments import Environment
from tests.frameworks.runs import (
    Ended,
    Finish,
    ShardtopRun,
    Workspace,
    alone,
    assert_ended_alike,
    torn_down_by_gloo,
    under_run,
)
from tests.support.distributed import free_port

SCRIPT = Path(__file__).with_name("saved_parameter.py")
STEPS = 4
FINAL = re.compile(r"^final steps=(\d+) loss=(\S+)$", re.MULTILINE)


def finish(output: str) -> Finish | None:
    found = FINAL.findall(output)
    return Finish(int(found[-1][0]), found[-1][1]) if found else None


def torchrun(engine: str) -> list[str]:
    return ["torchrun", "--nproc_per_node", "2", "--master_port", str(free_port()), str(SCRIPT), "--engine", engine]


@pytest.fixture(scope="module", params=["ddp", "zero3"])
def engine(request: pytest.FixtureRequest) -> str:
    name: str = request.param
    return name


@pytest.fixture(scope="module")
def space(trl_env: Environment, engine: str, tmp_path_factory: pytest.TempPathFactory) -> Workspace:
    return Workspace(trl_env, tmp_path_factory.mktemp(f"saved-parameter-{engine}"), (("DS_ACCELERATOR", "cpu"),))


@pytest.fixture(scope="module")
def trained(space: Workspace, engine: str) -> Ended:
    return alone(space, torchrun(engine), "alone")


@pytest.fixture(scope="module")
def probed(space: Workspace, engine: str) -> ShardtopRun:
    return under_run(space, torchrun(engine), "run")


def test_the_loss_trains_alone(trained: Ended) -> None:
    assert trained.code == 0 or torn_down_by_gloo(trained, ""), trained.output[-6000:]
    assert finish(trained.output) is not None, trained.output[-6000:]


def test_under_shardtop_run_it_ends_as_it_does_alone(trained: Ended, probed: ShardtopRun) -> None:
    assert_ended_alike(trained, probed, finish)


def test_shardtop_explained_the_steps_the_function_ran_in(probed: ShardtopRun) -> None:
    """The activations each module saved were measured: the explained steps ran around the function."""
    report = probed.report
    assert report, probed.describe()
    measured = [entry["act_bytes"] for module in report["modules"] for entry in module["ranks"]
                if entry["rank"] == 0 and entry.get("act_bytes")]
    assert measured, probed.describe()
