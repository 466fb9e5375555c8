"""Rehearsals recorded on one H200 (``tests/fixtures/runs/h200-rehearsal``), read back as a user reads
them (``shardtop report RUN --format json``), and set against what real multi-GPU runs measured.

The real figures come from runs of the same presets on two H200s (15 GiB per-process cap), made before
rehearsals existed and written down in ``bench/RESULTS.md`` ("two H200s, before the recordings"; story 2
as asked is also a recording, ``tests/fixtures/runs/h200x2``).  A rehearsal must land on them: the fake
process group changes what crosses ranks, not what a rank holds.  The users' own commands rehearsed as
ranks 0 and 7 of eight (``h200-rehearsal-own``) hold exactly the shares their engines deal.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.support.cli import shardtop
from tests.support.shares import dim0_share, zero3_share

RECORDINGS = Path(__file__).resolve().parents[1] / "fixtures" / "runs" / "h200-rehearsal"

REAL_2XH200_PEAK_2000_LAYERS = 8_456_457_728
"""zero3-linear-fixed model.n_layers=2000, two H200s: rank 0's allocator peak, bytes."""
REAL_2XH200_OOM_ALLOCATED_4000_LAYERS = 13_476_271_616
"""zero3-linear-fixed model.n_layers=4000, two H200s, 15 GiB cap: allocated at the OOM of the first Adam step."""
REAL_2XH200_OOM_MODULE = "model.net.15330"
"""zero3-linear as asked (18000 layers), two H200s: the Linear being moved when set-up ran out of memory."""


def recording(preset: str, *, contains: str = "") -> Path:
    found = [p for p in sorted(RECORDINGS.iterdir()) if p.is_dir() and p.name.split("-", 2)[2][:-5] == preset]
    found = [p for p in found if contains in (p / "run.json").read_text()]
    assert len(found) == 1, f"expected one recording of {preset} {contains!r}, found {found}"
    return found[0]


def report(run: Path, tmp_path: Path) -> dict[str, Any]:
    done = shardtop("report", str(run), "--format", "json", runs_dir=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    result: dict[str, Any] = json.loads(done.stdout)
    return result


def test_story_2_as_asked_on_six_gpus_fails_where_two_real_gpus_failed(tmp_path: Path) -> None:
    r = report(recording("zero3-linear"), tmp_path)
    assert r["rehearsal"]["world_size"] == 6 and r["rehearsal"]["ranks"] == [0]
    assert "H200" in r["rehearsal"]["on"]
    oom = r["oom"]
    assert oom["phase"] == "setup"
    assert oom["engine_step"] == "DeepSpeedEngine._configure_distributed_model"
    assert (oom["module"], oom["module_type"]) == (REAL_2XH200_OOM_MODULE, "Linear")
    finding = next(f for f in r["findings"] if f["code"] == "zero3-not-partitioned-at-init")
    assert "of 6" in finding["detail"] and "1/6" in finding["detail"]
    whole = r["model"]["bytes"]
    assert finding["saving_bytes"] == whole - whole // 6  # (N-1)/N of the model per GPU


def test_4000_layers_on_two_gpus_rehearsed_runs_out_at_the_first_adam_step_as_the_real_run_did(
    tmp_path: Path,
) -> None:
    r = report(recording("zero3-linear-fixed", contains='"n_layers": 4000'), tmp_path)
    oom = r["oom"]
    assert (oom["phase"], oom["step"]) == ("optimizer", 1)
    assert abs(oom["allocated"] - REAL_2XH200_OOM_ALLOCATED_4000_LAYERS) <= 1e-4 * REAL_2XH200_OOM_ALLOCATED_4000_LAYERS
    # each Linear(512, 512): half its weight, and its bias whole (under ZeRO-3's persistence threshold, 1e5)
    width = 512
    per_layer = width * width * 4 // 2 + width * 4
    layers = [m for m in r["modules"] if m["type"] == "Linear"]
    assert len(layers) == 4000
    assert all(m["ranks"][0]["bytes"] == per_layer for m in layers)
    assert r["ranks"][0]["param_bytes"] == per_layer * 4000


def test_2000_layers_on_two_gpus_rehearsed_peaks_where_the_real_run_peaked(tmp_path: Path) -> None:
    r = report(recording("zero3-linear-fixed", contains='"n_layers": 2000'), tmp_path)
    assert r["rehearsal"]["ranks"] == [0, 1]
    rank0 = next(k for k in r["ranks"] if k["rank"] == 0)
    assert rank0["status"] == "finished"
    peak = rank0["allocator"]["peak"]
    assert abs(peak - REAL_2XH200_PEAK_2000_LAYERS) <= 1e-4 * REAL_2XH200_PEAK_2000_LAYERS
    assert not r["oom"]


@pytest.mark.parametrize("preset", ["fsdp-not-sharding", "fsdp-auto-wrap"])
def test_both_ranks_of_two_rehearsed_one_after_another_hold_the_whole_model_between_them(
    preset: str, tmp_path: Path
) -> None:
    r = report(recording(preset), tmp_path)
    assert r["rehearsal"]["ranks"] == [0, 1]
    for module in r["modules"]:
        if module["bytes"] and len(module["ranks"]) == 2:
            held = [x["bytes"] for x in module["ranks"]]
            states = {x["state"] for x in module["ranks"]}
            if states <= {"unsharded"}:
                assert held == [module["bytes"]] * 2, module["path"]  # whole on every rank
            elif module["path"].count(".") == 0 and "sharded" in states:
                assert sum(held) == module["bytes"], module["path"]  # split between the ranks


def test_story_1_as_asked_rehearsed_on_two_shows_the_hand_wrapped_units_and_the_strays(tmp_path: Path) -> None:
    r = report(recording("fsdp-not-sharding"), tmp_path)
    codes = [f["code"] for f in r["findings"]]
    assert "fsdp-manual-wrap-ignored" in codes and "precision-mismatch" in codes
    conv1 = next(m for m in r["modules"] if m["path"] == "conv1")
    assert [x["state"] for x in conv1["ranks"]] == ["unsharded", "unsharded"]
    fixed = report(recording("fsdp-auto-wrap"), tmp_path)
    assert "fsdp-manual-wrap-ignored" not in [f["code"] for f in fixed["findings"]]
    ranks = sorted(fixed["ranks"], key=lambda k: k["rank"])
    assert abs(ranks[0]["param_bytes"] - ranks[1]["param_bytes"]) <= 64  # half each, up to FSDP's padding


OWN = Path(__file__).resolve().parents[1] / "fixtures" / "runs" / "h200-rehearsal-own"
Shape = tuple[int, ...]


def llama(module: dict[str, Any]) -> list[Shape]:
    """``hf_tiny.py``'s Llama: every module holds one parameter (its linear layers have no bias); ZeRO-3 cuts
    a parameter's elements whatever its shape."""
    return [(module["params"],)]


def with_bias(inputs: int) -> Callable[[dict[str, Any]], list[Shape]]:
    """A ``Linear(inputs, out)``'s weight and bias, ``out`` from its parameter count."""
    return lambda module: [(module["params"] // (inputs + 1), inputs), (module["params"] // (inputs + 1),)]


def fsdp2_train(module: dict[str, Any]) -> list[Shape]:
    """``fsdp2_train.py`` at ``--dim 64``: blocks of LayerNorm(64) and Linear(64, 64), a Linear(64, 1) head."""
    return [(64,), (64,)] if module["type"] == "LayerNorm" else with_bias(64)(module)


def lightning_gpt(module: dict[str, Any]) -> list[Shape]:
    """``lightning_deepspeed_user.py``'s model at its default width, 1024: an embedding of 32 000 tokens, blocks
    of LayerNorm, MultiheadAttention (in-projection and out-projection) and an MLP of 4 x 1024, a head."""
    width = 1024
    kind, path = module["type"], module["path"]
    if kind == "Embedding":
        return [(module["params"] // width, width)]
    if kind == "LayerNorm":
        return [(width,), (width,)]
    if kind == "MultiheadAttention":
        return [(3 * width, width), (3 * width,)]
    return with_bias(4 * width if path.endswith("mlp.2") else width)(module)


@dataclass(frozen=True)
class OwnRun:
    engine: str
    steps: int
    """The optimizer steps the script takes."""
    parameters: Callable[[dict[str, Any]], list[Shape]]
    """A module's own parameters, by shape, as the script builds them."""
    persistence: int = 0
    """ZeRO-3's persistence threshold: parameters of at most this many elements are whole on every rank."""


OWN_RUNS = {
    # HF Trainer with a DeepSpeed ZeRO-3 config, under torchrun; "auto" persistence: 10 x the hidden size, 30
    "hf_trainer": OwnRun("zero3", 3, llama, persistence=300),
    # accelerate launch with its DeepSpeed plugin, the same config
    "accelerate_train": OwnRun("zero3", 3, llama, persistence=300),
    # fully_shard under torchrun
    "fsdp2_train": OwnRun("fsdp2", 2, fsdp2_train),
    # Lightning Trainer(devices=8, strategy="deepspeed_stage_3"): Lightning's threshold, 100 000
    "lightning_deepspeed_user": OwnRun("zero3", 3, lightning_gpt, persistence=100_000),
    # raw DeepSpeed under the deepspeed launcher, DeepSpeed's threshold (100 000): its 256-wide layers are below
    "zero3_train": OwnRun("zero3", 2, with_bias(256), persistence=100_000),
}


def expected_share(own: OwnRun, module: dict[str, Any], world: int, rank: int) -> tuple[str, int]:
    """The state and the bytes of ``module``'s own parameters that ``rank`` of ``world`` holds."""
    shapes = own.parameters(module)
    assert sum(math.prod(shape) for shape in shapes) == module["params"], (module["path"], shapes)
    itemsize = module["bytes"] // module["params"]
    if own.engine == "fsdp2":
        return "sharded", itemsize * sum(dim0_share(shape, world, rank) for shape in shapes)
    numels = [math.prod(shape) for shape in shapes]
    held = sum(n if n <= own.persistence else zero3_share(n, world, rank) for n in numels)
    return ("persistent" if all(n <= own.persistence for n in numels) else "sharded"), itemsize * held


@pytest.mark.parametrize("script", list(OWN_RUNS))
def test_a_users_own_command_rehearsed_as_first_and_last_of_eight_on_an_h200(script: str, tmp_path: Path) -> None:
    """Each rank holds of each module exactly what its engine deals it: ZeRO-3's partitions of every parameter
    past the persistence threshold and the rest whole, FSDP2's rows of every parameter; rank 7's share is
    the short one."""
    run = next(p for p in OWN.iterdir() if p.is_dir() and p.name.split("-", 2)[2].rsplit("-", 1)[0] == script)
    r = report(run, tmp_path)
    own = OWN_RUNS[script]
    assert (r["engine"], r["world_size"], r["rehearsal"]["ranks"]) == (own.engine, 8, [0, 7])
    assert r["step"] == own.steps
    ranks = {k["rank"]: k for k in r["ranks"]}
    assert all(k["status"] == "finished" for k in ranks.values())
    totals = dict.fromkeys(ranks, 0)
    for module in (m for m in r["modules"] if m["params"]):
        held = {x["rank"]: (x["state"], x["bytes"]) for x in module["ranks"]}
        expected = {rank: expected_share(own, module, 8, rank) for rank in ranks}
        assert held == expected, module["path"]
        for rank, (_, held_bytes) in held.items():
            totals[rank] += held_bytes
    assert {rank: k["param_bytes"] for rank, k in ranks.items()} == totals


def test_story_2_fixed_on_six_gpus_rehearsed_gets_through_set_up_and_runs_out_at_the_first_adam_step(
    tmp_path: Path,
) -> None:
    """What the plan says of ``zero3-linear-fixed devices=6 gpu_mem_limit=15GiB``: partitioned as it is built,
    set-up fits; the first optimizer step (Adam's moments beside the fp32 partition) does not."""
    r = report(recording("zero3-linear-fixed", contains='"world_size": 6'), tmp_path)
    assert r["rehearsal"]["world_size"] == 6 and r["rehearsal"]["ranks"] == [0]
    oom = r["oom"]
    assert (oom["phase"], oom["step"], oom["engine_step"]) == ("optimizer", 1, "DeepSpeedEngine.step")
    width, layers = 512, 18000
    per_layer = -(-(width * width) // 6) * 4 + width * 4  # a sixth of each weight, each bias whole
    assert abs(r["ranks"][0]["param_bytes"] - per_layer * layers) <= 4 * 6 * layers
    assert abs(oom["requested_bytes"] - per_layer * layers) <= 0.01 * per_layer * layers, "one fp32 partition more"
    plan = r["plan"]
    assert (plan["devices"], plan["fits"], plan["runs_out_at"]) == (6, False, "optimizer step")
    assert plan["per_rank"][0]["reached"] == "optimizer step"
