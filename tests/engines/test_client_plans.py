"""The clients recorded on an H200 (``tests/fixtures/runs/h200-clients``) planned again, without a GPU, and set
against the peaks they reached there: the table of docs/your-own-job.md, to the one decimal it states.

A recording alone is not enough to plan from.  Its ``run.json`` keeps the command and its events the
module tree, the engine, what the rank held and its memory; a plan also needs the batch the script passes
(shapes and dtypes: the Trainer's ``position_ids`` too), the activations one forward saves at that batch,
the optimizer the script makes, and the engine's configuration as the engine got it (transformers fills
ZeRO-3's ``"auto"`` bucket sizes and persistence threshold from the model).  The scripts that made the
recordings are in the repository, so the recorded command is planned again: it runs in ``shardtop
plan``'s plan-only mode on one CPU process (``--cuda`` left out, gloo, ``DS_ACCELERATOR=cpu``,
``HF_TINY_SIZE=gpu`` as ``gpu/record.sh clients`` set it), which hands the model back from the engine's
entry point and traces it on the meta device at the batch the script passes; what its rank 0 saw is then
planned for the GPU the recording ran on, as ``shardtop plan -- CMD`` plans it there.

That reaches the engine the run used where the script picks it whatever the device: DeepSpeed ZeRO-3
(the Trainer, accelerate's plugin, LoRA) and ``fully_shard`` under torchrun.  The other four clients pick
theirs by device.  On CPU processes accelerate's FSDP plugin, and the Trainer's ``--fsdp`` that runs on
it, train with DDP: the command traced on CPU still gives the model, the batch and the optimizer, and the
FSDP2 units are those the recording's rank held (its ``Shards`` event after ``fully_shard``: each unit's
modules, and which kept their parameters whole after forward), as the plan-only mode reads them from
``fully_shard`` on a GPU.  Lightning's ``FSDPStrategy`` (its script asks for ``accelerator="cuda"``)
refuses a machine without GPU; its plan (``plans/lightning-bf16-true.json``) was made on the H200 on
2026-12-02 and is not made again here.
"""

from __future__ import annotations

import json
import shlex
import subprocess
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest

from shardtop.inject import plan_env
from shardtop.plan.cards import card
from shardtop.plan.compare import Plan, make_plan
from shardtop.plan.script import read_script_plan
from shardtop.plan.strategies import Strategy
from shardtop.rundir.engines import DDP, FSDP2
from shardtop.rundir.event_files import read_all
from shardtop.rundir.events import Event, Hello, Memory, Shards, Tree
from tests.support.cli import ROOT, report
from tests.support.own_job_runs import user_env

RECORDINGS = ROOT / "tests" / "fixtures" / "runs" / "h200-clients"
PLAN_S = 600
"""A deadline: each plan imports torch, transformers and DeepSpeed on a CPU process (10 to 30 s on 2 cores)."""


@dataclass(frozen=True)
class Client:
    name: str
    """The recording's name (``gpu/record.sh clients``)."""
    error_percent: float
    """The figure docs/your-own-job.md shows: the plan's peak against the allocator's peak, in per cent, one decimal."""
    hf_tiny_gpu: bool = True
    """``HF_TINY_SIZE=gpu``: the Llama of 168 M parameters the Hugging Face scripts build for GPU runs."""
    units_recorded: bool = False
    """The script trains with DDP on CPU processes: planned with the FSDP2 units of the recording."""


CLIENTS = [
    Client("hf-trainer-zero3", +0.1),
    Client("accelerate-zero3", +0.1),
    Client("peft-lora-zero3", -0.6),
    Client("compile-fsdp2", -18.6, hf_tiny_gpu=False),
    Client("hf-trainer-fsdp", -0.4, units_recorded=True),
    Client("accelerate-fsdp2", -0.4, units_recorded=True),
    Client("peft-lora-fsdp2", +0.8, units_recorded=True),
]


def recording(name: str) -> Path:
    found = [p for p in sorted(RECORDINGS.iterdir()) if p.is_dir() and p.name[16:-5] == name]
    assert len(found) == 1, (name, found)
    return found[0]


def recorded_units(strategy: Strategy, events: Sequence[Event]) -> Strategy:
    """``strategy`` with the FSDP2 units the recording's rank 0 held after ``fully_shard``: each unit's
    modules (a unit of several, as ``fully_shard([norm, lm_head])`` makes, by each of them) and those that
    kept their parameters whole after forward."""
    tree = next(e for e in events if isinstance(e, Tree))
    shards = next(e for e in events if isinstance(e, Shards) and e.stage == "engine" and e.rank == 0)
    unit = shards.unit
    rows = [r for r, u in enumerate(unit) if u >= 0 and (r == 0 or unit[tree.parents[r]] != u)]
    kept = [r for r in rows if shards.units[unit[r]].strategy == "SHARD_GRAD_OP"]
    return strategy.with_(engine=FSDP2, sharding="FULL_SHARD", units=tuple(r for r in rows if r != 0),
                          root_wrapped=0 in rows, kept_whole=tuple(r for r in kept if r != 0))


def planned_again(run: Path, client: Client) -> tuple[Plan, list[str]]:
    """The recorded command's plan for the recorded GPU, from its script traced on a CPU process."""
    command = [word for word in json.loads((run / "run.json").read_text())["command"] if word != "--cuda"]
    events, _ = read_all(run / "events")
    gpu = next(g for e in events if isinstance(e, Memory) and e.gpus for g in e.gpus)
    with tempfile.TemporaryDirectory(prefix="shardtop-plan-") as seen_dir:
        env = plan_env(user_env(HF_TINY_SIZE="gpu" if client.hf_tiny_gpu else ""), Path(seen_dir))
        done = subprocess.run(command, env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True, timeout=PLAN_S, check=False)
        seen = read_script_plan(Path(seen_dir))
    assert seen is not None, f"{shlex.join(command)}: exit {done.returncode}, no plan\n{done.stdout[-3000:]}"
    strategy = seen.strategy
    if client.units_recorded:
        assert strategy.engine == DDP, f"{client.name} traced on CPU as {strategy.engine}"
        assert tree_names(events) == seen.description.names, "the recording's tree is the traced model's"
        strategy = recorded_units(strategy, events)
    plan = make_plan(seen.description, strategy, devices=seen.devices, accelerator="cuda",
                     gpu=card(gpu.name.removeprefix("NVIDIA ").strip(), gpu.total, "the recording"),
                     command=shlex.join(command), notes=tuple(seen.notes))
    return plan, [e.engine for e in events if isinstance(e, Hello)]


def tree_names(events: Sequence[Event]) -> list[str]:
    return next(e for e in events if isinstance(e, Tree)).names


@pytest.mark.timeout(2 * PLAN_S)
@pytest.mark.parametrize("client", CLIENTS, ids=lambda c: c.name)
def test_the_command_planned_again_is_off_its_recorded_peak_by_the_readmes_figure(client: Client) -> None:
    run = recording(client.name)
    plan, engines = planned_again(run, client)
    peak = json.loads(report(run, "json"))["ranks"][0]["allocator"]["peak"]
    asked = plan.asked
    assert engines == [asked.strategy.engine], "planned for the engine the run used"
    assert any("taken as the batch per rank" in note for note in plan.notes), "traced at the batch it passes"
    assert asked.fits is True
    error = 100 * (asked.per_rank.peak / peak - 1)
    assert round(error, 1) == client.error_percent, (error, asked.strategy.label, asked.per_rank.peak, peak)
