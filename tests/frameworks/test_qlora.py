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
layer keeps), and once in two processes under DeepSpeed ZeRO-3 as Hugging
Face documents it for QLoRA (the 4-bit weights packed in fp32 too, ZeRO-3
enabled before the model is loaded, then ``deepspeed.initialize``), each rank
holding its part of every parameter and the small ones whole, as DeepSpeed's
own attributes say.  Each set-up is also planned for eight ranks (``shardtop
plan``), and every figure of the plan is checked against the model's own: the
4-bit weights at their stored bytes, gradients and AdamW state for the
adapters only, the activations as torch saves them with gradient checkpointing
on (``qlora_saved.py``); and so is every other row of the plan (other engines,
mixed precision), where a 4-bit weight is never cast nor trained.  Run in axolotl's environment (bitsandbytes 0.50.2,
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
    zero3: bool = False
    """DeepSpeed ZeRO-3 instead of DDP (two processes): every parameter partitioned over the ranks, the small ones
    also kept whole on each."""

    @property
    def engine(self) -> str:
        return "fsdp2" if self.fsdp2 else "zero3" if self.zero3 else "ddp" if self.processes > 1 else "single"

    @property
    def name(self) -> str:
        return f"qlora-{self.processes}{'-double-quant' if self.double_quant else ''}-{self.engine}"


def command(setup: Setup) -> list[str]:
    script = [str(SCRIPT), *(["--double-quant"] if setup.double_quant else []), *(["--fsdp2"] if setup.fsdp2 else []),
              *(["--zero3"] if setup.zero3 else [])]
    if setup.processes == 1:
        return ["python", *script]
    return ["torchrun", "--nproc_per_node", str(setup.processes), "--master_port", str(free_port()), *script]


@pytest.fixture(scope="module", params=[Setup(1), Setup(2), Setup(1, double_quant=True), Setup(2, fsdp2=True),
                                        Setup(2, zero3=True)],
                ids=["one-process", "ddp", "double-quant", "fsdp2", "zero3"])
def setup(request: pytest.FixtureRequest) -> Setup:
    chosen: Setup = request.param
    return chosen


@pytest.fixture(scope="module")
def space(axolotl_env: Environment, setup: Setup, tmp_path_factory: pytest.TempPathFactory) -> Workspace:
    on_cpu = (("DS_ACCELERATOR", "cpu"),) if setup.zero3 else ()
    return Workspace(axolotl_env, tmp_path_factory.mktemp(setup.name), on_cpu)


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
    """Over how many ranks each parameter is split: all of them under FSDP2 and ZeRO-3 (every dimension FSDP2
    shards on, and every parameter ZeRO-3 splits flat, divides evenly here), none under DDP."""
    return ranks if setup.fsdp2 or setup.zero3 else 1


def held_params(setup: Setup, log: str, rank: int) -> int:
    """Bytes of the parameters a rank holds after training, the 4-bit weights as stored: under ZeRO-3 what the
    rank says DeepSpeed left it (its part of every parameter, and the persistent ones whole too), else its share
    of the script's parameters."""
    if setup.zero3:
        return printed(log, f"rank {rank} zero3")
    return printed(log, "params") // sharded_over(setup, setup.processes)


def test_the_report_reads_the_4bit_weights_as_the_script_holds_them(probed: ShardtopRun, setup: Setup) -> None:
    """Each rank's parameters are the bytes the script's parameters hold, the 4-bit weights as stored (under
    FSDP2 and ZeRO-3, the rank's share of them, and under ZeRO-3 the small parameters whole); its gradients, the
    adapters' (their share)."""
    report, log = probed.report, probed.command_log()
    assert report, probed.describe()
    assert len(report["ranks"]) == setup.processes, probed.describe()
    share = sharded_over(setup, setup.processes)
    for rank in report["ranks"]:
        assert rank["param_bytes"] == held_params(setup, log, rank["rank"]), probed.describe()
        assert rank["grad_bytes"] == printed(log, "trainable") // share, probed.describe()
        if setup.zero3:  # AdamW's state and DeepSpeed's fp32 master copy, of the rank's part of the adapters
            assert rank["optim_bytes"] == (ADAMW_STATES + 1) * rank["grad_bytes"], probed.describe()
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


def input_embedding_bytes(report: dict[str, Any]) -> int:
    """The input embedding's weight whole, as the report's tree counts it.  Under ZeRO-3 it stays gathered from
    its forward until the optimizer's step releases every parameter: frozen, and fed token ids, it gets no
    gradient, so the release ZeRO-3 makes after a module's backward never comes for it."""
    return sum(module["bytes"] for module in report["modules"] if module["path"].endswith(".embed_tokens"))


def test_the_parameters_memory_holds_the_4bit_weights_quant_state(probed: ShardtopRun, setup: Setup) -> None:
    """Each rank's memory of kind params is its parameters' storage and the tensors of every ``quant_state``
    (the blocks' scales and the code each 4-bit weight is dequantized with), whole on every rank under FSDP2
    and ZeRO-3 too.  Under FSDP2, a split taken between a forward and the end of its backward also holds the
    root unit whole; under ZeRO-3, one taken in a forward or a backward at most every partitioned parameter
    whole (gathered for compute, or prefetched), and one taken in the optimizer's step may still hold the input
    embedding whole."""
    report, log = probed.report, probed.command_log()
    assert report, probed.describe()
    for rank in report["ranks"]:
        split = rank["memory_now"]
        assert split is not None, f"rank {rank['rank']}: no memory split\n{probed.describe()}"
        expected = held_params(setup, log, rank["rank"]) + printed(log, "quant_state")
        held = split["by_kind"]["params"]
        said = (f"rank {rank['rank']} in its {split['phase']} phase of step {split['step']}: {split['by_kind']}, "
                f"expected {expected}")
        if setup.zero3 and split["phase"] in ("forward", "backward"):
            gathered = printed(log, "params") - printed(log, "persistent")
            assert expected <= held <= expected + gathered, f"{said}, and at most {gathered} gathered"
        elif setup.zero3 and split["phase"] == "optimizer":
            embedding = input_embedding_bytes(report)
            assert held in {expected, expected + embedding}, f"{said}, or the input embedding whole beside"
        elif setup.fsdp2:
            assert held in {expected, expected + root_unit_bytes(report)}, f"{said}, or the root unit whole beside"
        else:
            assert held == expected, said


def test_shardtop_explained_the_steps_bitsandbytes_ran_in(probed: ShardtopRun) -> None:
    """The activations the model saved were measured: the explained steps ran around bitsandbytes' matmul."""
    measured = [entry["act_bytes"] for module in probed.report["modules"] for entry in module["ranks"]
                if entry.get("act_bytes")]
    assert measured, probed.describe()


def test_plan_of_eight_ranks_counts_the_model_as_it_is_held(plan: Plan, setup: Setup, saved: Saved) -> None:
    """``shardtop plan devices=8`` of the command as its user types it, each figure against the model's own:
    the parameters as the model stands for them, their bytes with the 4-bit weights as stored; per rank
    those bytes (a share of them under FSDP2) and every ``quant_state`` whole; gradients and AdamW's state
    for the adapters alone (and under ZeRO-3 its fp32 master copy of their share); the activations torch saves
    with gradient checkpointing on, and the batch.  Under ZeRO-3 the parameters per rank are a share of every
    parameter and the persistent ones whole."""
    assert plan.ended.code == 0, plan.describe()
    assert "could not trace" not in plan.stderr, plan.describe()
    assert plan.plan is not None, plan.describe()
    facts = plan.stderr  # the script's own lines, printed before its first forward
    assert plan.plan["model"]["params"] == printed(facts, "logical", "params"), plan.describe()
    assert plan.plan["model"]["bytes"] == printed(facts, "params"), plan.describe()
    assert plan.plan["model"]["batch_size"] == BATCH, plan.describe()
    option = plan.as_run()
    assert option["engine"] == setup.engine, option
    per_rank, share = option["per_rank"], sharded_over(setup, PLANNED_RANKS)
    said = f"{option['strategy']}: {per_rank}\n{plan.describe()}"
    persistent = printed(facts, "persistent") if setup.zero3 else 0
    assert per_rank["params"] == printed(facts, "params") // share + persistent + printed(facts, "quant_state"), said
    assert per_rank["grads"] == printed(facts, "trainable") // share, said
    master = 1 if setup.zero3 else 0
    assert per_rank["optimizer"] == (ADAMW_STATES + master) * per_rank["grads"], said
    assert per_rank["activations"] == saved.activations + saved.batch, said


FP32 = 4
"""Bytes of an element of the script's model (and of its 4-bit weights' packing under FSDP2 and ZeRO-3)."""
BF16 = 2
"""Bytes of an element a mixed-precision row computes in."""


@dataclass(frozen=True)
class Stored:
    """The script's parameters as it printed them, in bytes as it holds them (fp32; a 4-bit weight packed)."""

    params: int
    packed: int
    """The 4-bit weights'."""
    trainable: int
    quant_state: int
    persistent: int
    """What ZeRO-3 keeps whole under the threshold the plan's ZeRO-3 rows use."""
    persistent_packed: int

    @classmethod
    def printed_in(cls, output: str) -> Stored:
        return cls(printed(output, "params"), printed(output, "4bit"), printed(output, "trainable"),
                   printed(output, "quant_state"), printed(output, "persistent"), printed(output, "persistent 4bit"))


def computed_in(total: int, packed: int, element: int) -> int:
    """Bytes of fp32 parameters of ``total`` bytes when every element is held at ``element`` bytes but the 4-bit
    weights' (``packed`` of them), which stay packed as stored."""
    return (total - packed) // FP32 * element + packed


def expected_row(option: dict[str, Any], model: Stored, ranks: int) -> dict[str, int]:
    """What a row of the plan must say a rank holds, worked out from the model's own bytes.

    A 4-bit weight is never cast, never trained, and split only by an engine that splits every parameter:
    DDP keeps the model whole; FSDP keeps fp32 shards (mixed precision too) and gathers each unit at the
    precision it computes in (this model has two decoder layers: the root and two layers whole at once are
    all of it); DeepSpeed casts the model to the precision it computes in, keeps ZeRO-1/2's parameters whole
    and ZeRO-3's split flat (every parameter here divides by eight), the small ones whole too.  Every
    ``quant_state`` whole on every rank; gradients and the optimizer's state for the adapters only (ZeRO: its
    fp32 master copy too, of the rank's part).
    """
    element = BF16 if option["precision"] != "fp32" else FP32
    quant_state, trainable = model.quant_state, model.trainable
    engine = option["engine"]
    if engine in ("single", "ddp"):
        return {"params": model.params + quant_state, "grads": trainable, "optimizer": ADAMW_STATES * trainable,
                "gathered": 0}
    if engine in ("fsdp1", "fsdp2"):
        return {"params": model.params // ranks + quant_state, "grads": trainable // ranks,
                "optimizer": ADAMW_STATES * trainable // ranks,
                "gathered": computed_in(model.params, model.packed, element)}
    whole = computed_in(model.params, model.packed, element)
    grads = computed_in(trainable, 0, element)
    held = {
        "zero1": {"params": whole + quant_state, "grads": grads},
        "zero2": {"params": whole + quant_state, "grads": grads // ranks},
        "zero3": {"params": whole // ranks + computed_in(model.persistent, model.persistent_packed, element)
                  + quant_state, "grads": grads // ranks},
    }[engine]
    return {**held, "optimizer": (ADAMW_STATES + 1) * trainable // ranks}


def test_every_row_of_the_plan_holds_the_4bit_weights_as_stored(plan: Plan) -> None:
    """Each strategy the plan shows beside the one the script runs (other engines, mixed precision), each
    figure against the model's own: the 4-bit weights at their stored bytes whatever the precision, split only
    where the engine splits every parameter, with no gradient and no optimizer state.  No ZeRO-3 row has the
    model built inside ``zero.Init``, which a 4-bit model never is."""
    assert plan.plan is not None, plan.describe()
    model = Stored.printed_in(plan.stderr)
    options = plan.plan["options"]
    engines = {option["engine"] for option in options}
    assert {"ddp", "zero1", "zero2", "zero3", "fsdp1", "fsdp2"} <= engines, [o["strategy"] for o in options]
    assert any(option["precision"] == "bf16-mixed" for option in options), [o["strategy"] for o in options]
    for option in options:
        # bitsandbytes quantizes a weight whole, and transformers loads a 4-bit model whole even under ZeRO-3
        assert option["built_whole"] or option["engine"] != "zero3", f"{option['strategy']}: built in zero.Init"
        expected = expected_row(option, model, PLANNED_RANKS)
        said = {kind: option["per_rank"][kind] for kind in expected}
        assert said == expected, f"{option['strategy']}: the plan says {said}, the model {expected}"
