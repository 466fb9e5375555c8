"""QLoRA on CPU under shardtop: bitsandbytes' 4-bit weights and peft's LoRA adapters, as their users train them.

``qlora_cpu.py`` loads a tiny Llama in 4 bits (nf4) with ``BitsAndBytesConfig``
and trains LoRA adapters on it with AdamW, in one process or in two under
``torchrun`` (DDP over gloo).  bitsandbytes' matmul is an ``autograd.Function``
that keeps the 4-bit weight (a ``Params4bit``) and its ``quant_state`` on its
context and dequantizes the weight with them in backward: shardtop's explained
steps (the first steps of every run) must leave them as they were, and the run
must end as it does alone.  Run in axolotl's environment (bitsandbytes 0.50.2,
peft, transformers).
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

SCRIPT = Path(__file__).with_name("qlora_cpu.py")
FINAL = re.compile(r"^final steps=(\d+) loss=(\S+)$", re.MULTILINE)


def finish(output: str) -> Finish | None:
    found = FINAL.findall(output)
    return Finish(int(found[-1][0]), found[-1][1]) if found else None


def command(processes: int) -> list[str]:
    if processes == 1:
        return ["python", str(SCRIPT)]
    return ["torchrun", "--nproc_per_node", str(processes), "--master_port", str(free_port()), str(SCRIPT)]


@pytest.fixture(scope="module", params=[1, 2], ids=["one-process", "ddp"])
def processes(request: pytest.FixtureRequest) -> int:
    count: int = request.param
    return count


@pytest.fixture(scope="module")
def space(axolotl_env: Environment, processes: int, tmp_path_factory: pytest.TempPathFactory) -> Workspace:
    return Workspace(axolotl_env, tmp_path_factory.mktemp(f"qlora-{processes}"))


@pytest.fixture(scope="module")
def trained(space: Workspace, processes: int) -> Ended:
    return alone(space, command(processes), "alone")


@pytest.fixture(scope="module")
def probed(space: Workspace, processes: int) -> ShardtopRun:
    return under_run(space, command(processes), "run")


def test_qlora_trains_alone(trained: Ended) -> None:
    assert trained.code == 0 or torn_down_by_gloo(trained, ""), trained.output[-6000:]
    assert finish(trained.output) is not None, trained.output[-6000:]


def test_under_shardtop_run_it_ends_as_it_does_alone(trained: Ended, probed: ShardtopRun) -> None:
    assert_ended_alike(trained, probed, finish)


def printed(output: str, what: str) -> int:
    found = re.findall(rf"^{what} bytes=(\d+)$", output, re.MULTILINE)
    assert found, f"the script did not print its {what} bytes:\n{output[-3000:]}"
    return int(found[-1])


def test_the_report_reads_the_4bit_weights_as_the_script_holds_them(probed: ShardtopRun, processes: int) -> None:
    """Each rank's parameters are the bytes the script's parameters hold, the 4-bit weights as stored."""
    report, log = probed.report, probed.command_log()
    assert report, probed.describe()
    assert len(report["ranks"]) == processes, probed.describe()
    for rank in report["ranks"]:
        assert rank["param_bytes"] == printed(log, "params"), probed.describe()
        assert rank["grad_bytes"] == printed(log, "trainable"), probed.describe()
    quantised = sum(module["bytes"] for module in report["modules"] if module["type"] == "Linear4bit")
    assert quantised == printed(log, "4bit"), probed.describe()


def test_shardtop_explained_the_steps_bitsandbytes_ran_in(probed: ShardtopRun) -> None:
    """The activations the model saved were measured: the explained steps ran around bitsandbytes' matmul."""
    measured = [entry["act_bytes"] for module in probed.report["modules"] for entry in module["ranks"]
                if entry.get("act_bytes")]
    assert measured, probed.describe()
