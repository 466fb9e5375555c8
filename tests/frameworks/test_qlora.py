"""QLoRA on CPU under shardtop: bitsandbytes' 4-bit weights and peft's LoRA adapters, as their users train them.

``qlora_cpu.py`` loads a tiny Llama in 4 bits (nf4) with ``BitsAndBytesConfig``
and trains LoRA adapters on it with AdamW, in one process or in two under
``torchrun`` (DDP over gloo).  bitsandbytes' matmul is an ``autograd.Function``
that keeps the 4-bit weight (a ``Params4bit``) and its ``quant_state`` on its
context and dequantizes the weight with them in backward: shardtop's explained
steps (the first steps of every run) must leave them as they were, and the run
must end as it does alone.  Once more in one process with nested ("double")
quantization, where each ``quant_state`` holds a state of its own for the
scales.  Run in axolotl's environment (bitsandbytes 0.50.2, peft, transformers).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
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


@dataclass(frozen=True)
class Setup:
    """How the script is run: in how many processes, and whether the 4-bit weights' scales are quantized too."""

    processes: int
    double_quant: bool = False


def command(setup: Setup) -> list[str]:
    script = [str(SCRIPT), *(["--double-quant"] if setup.double_quant else [])]
    if setup.processes == 1:
        return ["python", *script]
    return ["torchrun", "--nproc_per_node", str(setup.processes), "--master_port", str(free_port()), *script]


@pytest.fixture(scope="module", params=[Setup(1), Setup(2), Setup(1, double_quant=True)],
                ids=["one-process", "ddp", "double-quant"])
def setup(request: pytest.FixtureRequest) -> Setup:
    chosen: Setup = request.param
    return chosen


@pytest.fixture(scope="module")
def processes(setup: Setup) -> int:
    return setup.processes


@pytest.fixture(scope="module")
def space(axolotl_env: Environment, setup: Setup, tmp_path_factory: pytest.TempPathFactory) -> Workspace:
    name = f"qlora-{setup.processes}{'-double-quant' if setup.double_quant else ''}"
    return Workspace(axolotl_env, tmp_path_factory.mktemp(name))


@pytest.fixture(scope="module")
def trained(space: Workspace, setup: Setup) -> Ended:
    return alone(space, command(setup), "alone")


@pytest.fixture(scope="module")
def probed(space: Workspace, setup: Setup) -> ShardtopRun:
    return under_run(space, command(setup), "run")


def test_qlora_trains_alone(trained: Ended) -> None:
    assert trained.code == 0 or torn_down_by_gloo(trained, ""), trained.output[-6000:]
    assert finish(trained.output) is not None, trained.output[-6000:]


def test_under_shardtop_run_it_ends_as_it_does_alone(trained: Ended, probed: ShardtopRun) -> None:
    assert_ended_alike(trained, probed, finish)


def printed(output: str, what: str, unit: str = "bytes") -> int:
    found = re.findall(rf"^{what} {unit}=(\d+)$", output, re.MULTILINE)
    assert found, f"the script did not print its {what} {unit}:\n{output[-3000:]}"
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


def test_the_report_counts_the_elements_the_4bit_weights_stand_for(probed: ShardtopRun) -> None:
    """The model's parameters as its config makes them (plus the adapters): a 4-bit weight counts the elements of
    its ``quant_state.shape``, not those of its packed storage."""
    report, log = probed.report, probed.command_log()
    assert report, probed.describe()
    assert report["model"]["params"] == printed(log, "logical", "params"), probed.describe()
    quantised = sum(module["params"] for module in report["modules"] if module["type"] == "Linear4bit")
    assert quantised == printed(log, "4bit", "params"), probed.describe()


def test_the_parameters_memory_holds_the_4bit_weights_quant_state(probed: ShardtopRun) -> None:
    """Each rank's memory of kind params is its parameters' storage and the tensors of every ``quant_state``
    (the blocks' scales and the code each 4-bit weight is dequantized with)."""
    report, log = probed.report, probed.command_log()
    assert report, probed.describe()
    expected = printed(log, "params") + printed(log, "quant_state")
    for rank in report["ranks"]:
        split = rank["memory_now"]
        assert split is not None, f"rank {rank['rank']}: no memory split\n{probed.describe()}"
        assert split["by_kind"]["params"] == expected, f"rank {rank['rank']}: {split['by_kind']}"


def test_shardtop_explained_the_steps_bitsandbytes_ran_in(probed: ShardtopRun) -> None:
    """The activations the model saved were measured: the explained steps ran around bitsandbytes' matmul."""
    measured = [entry["act_bytes"] for module in probed.report["modules"] for entry in module["ranks"]
                if entry.get("act_bytes")]
    assert measured, probed.describe()
