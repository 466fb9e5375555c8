"""QLoRA on CPU under shardtop: bitsandbytes' 4-bit weights and peft's LoRA adapters, as their users train them.

``qlora_cpu.py`` loads a tiny Llama in 4 bits (nf4) with ``BitsAndBytesConfig``
and trains LoRA adapters on it with AdamW, in one process or in two under
``torchrun`` (DDP over gloo).  bitsandbytes' matmul is an ``autograd.Function``
that keeps the 4-bit weight (a ``Params4bit``) and its ``quant_state`` on its
context and dequantizes the weight with them in backward: shardtop's explained
steps (the first steps of every run) must leave them as they were, and the run
must end as it does alone.  Once more in one process with nested ("double")
quantization, where each ``quant_state`` holds a state of its own for the
scales, and once in two processes under FSDP2 (``fully_shard`` per decoder
layer and on the root, the 4-bit weights packed in fp32 so that they shard
like the rest: a shard is a DTensor without a ``quant_state``, which the
layer keeps).  Each set-up is also planned for eight ranks (``shardtop plan``),
and every figure of the plan is checked against the model's own: the 4-bit
weights at their stored bytes, gradients and AdamW state for the adapters only,
the activations as torch saves them with gradient checkpointing on
(``qlora_saved.py``).  Run in axolotl's environment (bitsandbytes 0.50.2,
peft, transformers).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.frameworks.environments import Environment
from tests.frameworks.runs import (
    Ended,
    Finish,
    Plan,
    ShardtopRun,
    Workspace,
    alone,
    assert_ended_alike,
    planned,
    torn_down_by_gloo,
    under_run,
)
from tests.support.distributed import free_port

SCRIPT = Path(__file__).with_name("qlora_cpu.py")
SAVED_SCRIPT = Path(__file__).with_name("qlora_saved.py")
FINAL = re.compile(r"^final steps=(\d+) loss=(\S+)$", re.MULTILINE)
PLANNED_RANKS = 8
"""``shardtop plan devices=8``."""
BATCH = 2
"""The script's batch per rank."""
ADAMW_STATES = 2
"""AdamW keeps two tensors per trained element (its step counters aside, a scalar per parameter)."""


def finish(output: str) -> Finish | None:
    found = FINAL.findall(output)
    return Finish(int(found[-1][0]), found[-1][1]) if found else None


@dataclass(frozen=True)
class Setup:
    """How the script is run: in how many processes, under which engine, and whether the 4-bit weights' scales
    are quantized too."""

    processes: int
    double_quant: bool = False
    fsdp2: bool = False
    """FSDP2 instead of DDP (two processes): every parameter sharded over the ranks."""

    @property
    def name(self) -> str:
        return f"qlora-{self.processes}{'-double-quant' if self.double_quant else ''}{'-fsdp2' if self.fsdp2 else ''}"


def command(setup: Setup) -> list[str]:
    script = [str(SCRIPT), *(["--double-quant"] if setup.double_quant else []), *(["--fsdp2"] if setup.fsdp2 else [])]
    if setup.processes == 1:
        return ["python", *script]
    return ["torchrun", "--nproc_per_node", str(setup.processes), "--master_port", str(free_port()), *script]


@pytest.fixture(scope="module", params=[Setup(1), Setup(2), Setup(1, double_quant=True), Setup(2, fsdp2=True)],
                ids=["one-process", "ddp", "double-quant", "fsdp2"])
def setup(request: pytest.FixtureRequest) -> Setup:
    chosen: Setup = request.param
    return chosen


@pytest.fixture(scope="module")
def space(axolotl_env: Environment, setup: Setup, tmp_path_factory: pytest.TempPathFactory) -> Workspace:
    return Workspace(axolotl_env, tmp_path_factory.mktemp(setup.name))


@pytest.fixture(scope="module")
def trained(space: Workspace, setup: Setup) -> Ended:
    return alone(space, command(setup), "alone")


@pytest.fixture(scope="module")
def probed(space: Workspace, setup: Setup) -> ShardtopRun:
    return under_run(space, command(setup), "run")


@pytest.fixture(scope="module")
def plan(space: Workspace, setup: Setup) -> Plan:
    return planned(space, command(setup), "plan")


@dataclass(frozen=True)
class Saved:
    """What one forward saves for backward as torch sees it, and the batch it is called with (bytes)."""

    activations: int
    batch: int


@pytest.fixture(scope="module")
def saved(axolotl_env: Environment, tmp_path_factory: pytest.TempPathFactory) -> Saved:
    space = Workspace(axolotl_env, tmp_path_factory.mktemp("qlora-saved"))
    ended = alone(space, ["python", str(SAVED_SCRIPT)], "saved")
    assert ended.code == 0, ended.output[-6000:]
    return Saved(printed(ended.output, "saved"), printed(ended.output, "batch"))


def test_qlora_trains_alone(trained: Ended) -> None:
    assert trained.code == 0 or torn_down_by_gloo(trained, ""), trained.output[-6000:]
    assert finish(trained.output) is not None, trained.output[-6000:]


def test_under_shardtop_run_it_ends_as_it_does_alone(trained: Ended, probed: ShardtopRun) -> None:
    assert_ended_alike(trained, probed, finish)


def printed(output: str, what: str, unit: str = "bytes") -> int:
    found = re.findall(rf"^{what} {unit}=(\d+)$", output, re.MULTILINE)
    assert found, f"the script did not print its {what} {unit}:\n{output[-3000:]}"
    return int(found[-1])


def sharded_over(setup: Setup, ranks: int) -> int:
    """Over how many ranks each parameter is split: all of them under FSDP2 (every dimension this model shards
    on divides evenly), none under DDP."""
    return ranks if setup.fsdp2 else 1


def test_the_report_reads_the_4bit_weights_as_the_script_holds_them(probed: ShardtopRun, setup: Setup) -> None:
    """Each rank's parameters are the bytes the script's parameters hold, the 4-bit weights as stored (under
    FSDP2, the rank's share of them)."""
    report, log = probed.report, probed.command_log()
    assert report, probed.describe()
    assert len(report["ranks"]) == setup.processes, probed.describe()
    share = sharded_over(setup, setup.processes)
    for rank in report["ranks"]:
        assert rank["param_bytes"] == printed(log, "params") // share, probed.describe()
        assert rank["grad_bytes"] == printed(log, "trainable") // share, probed.describe()
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


def root_unit_bytes(report: dict[str, Any]) -> int:
    """Bytes of the parameters outside the decoder layers (embedding, final norm, head), as the report's tree
    counts them: FSDP2's root unit, which it keeps whole from the forward until the end of the backward."""
    return sum(module["bytes"] for module in report["modules"] if ".layers." not in module["path"])


def test_the_parameters_memory_holds_the_4bit_weights_quant_state(probed: ShardtopRun, setup: Setup) -> None:
    """Each rank's memory of kind params is its parameters' storage and the tensors of every ``quant_state``
    (the blocks' scales and the code each 4-bit weight is dequantized with), whole on every rank under FSDP2
    too.  Under FSDP2, a split taken between a forward and the end of its backward also holds the root unit
    whole."""
    report, log = probed.report, probed.command_log()
    assert report, probed.describe()
    expected = printed(log, "params") // sharded_over(setup, setup.processes) + printed(log, "quant_state")
    allowed = {expected, expected + root_unit_bytes(report)} if setup.fsdp2 else {expected}
    for rank in report["ranks"]:
        split = rank["memory_now"]
        assert split is not None, f"rank {rank['rank']}: no memory split\n{probed.describe()}"
        assert split["by_kind"]["params"] in allowed, (
            f"rank {rank['rank']} in its {split['phase']} phase of step {split['step']}: {split['by_kind']}, "
            f"expected one of {sorted(allowed)}")


def test_shardtop_explained_the_steps_bitsandbytes_ran_in(probed: ShardtopRun) -> None:
    """The activations the model saved were measured: the explained steps ran around bitsandbytes' matmul."""
    measured = [entry["act_bytes"] for module in probed.report["modules"] for entry in module["ranks"]
                if entry.get("act_bytes")]
    assert measured, probed.describe()


def test_plan_of_eight_ranks_counts_the_model_as_it_is_held(plan: Plan, setup: Setup, saved: Saved) -> None:
    """``shardtop plan devices=8`` of the command as its user types it, each figure against the model's own:
    the parameters as the model stands for them, their bytes with the 4-bit weights as stored; per rank
    those bytes (a share of them under FSDP2) and every ``quant_state`` whole; gradients and AdamW's state
    for the adapters alone; the activations torch saves with gradient checkpointing on, and the batch."""
    assert plan.ended.code == 0, plan.describe()
    assert "could not trace" not in plan.stderr, plan.describe()
    assert plan.plan is not None, plan.describe()
    facts = plan.stderr  # the script's own lines, printed before its first forward
    assert plan.plan["model"]["params"] == printed(facts, "logical", "params"), plan.describe()
    assert plan.plan["model"]["bytes"] == printed(facts, "params"), plan.describe()
    assert plan.plan["model"]["batch_size"] == BATCH, plan.describe()
    option = plan.as_run()
    assert option["engine"] == ("fsdp2" if setup.fsdp2 else "ddp" if setup.processes > 1 else "single"), option
    per_rank, share = option["per_rank"], sharded_over(setup, PLANNED_RANKS)
    said = f"{option['strategy']}: {per_rank}\n{plan.describe()}"
    assert per_rank["params"] == printed(facts, "params") // share + printed(facts, "quant_state"), said
    assert per_rank["grads"] == printed(facts, "trainable") // share, said
    assert per_rank["optimizer"] == ADAMW_STATES * per_rank["grads"], said
    assert per_rank["activations"] == saved.activations + saved.batch, said
