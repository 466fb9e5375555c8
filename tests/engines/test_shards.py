"""Shard readers against real engines on CPU processes (gloo), no fakes.

The two laws every engine must obey: summed over the ranks, each module's
stored bytes are its full size (sharded) or N times it (replicated); and per
rank they agree with the engine's own books (FlatParameter sizes, DTensor
``to_local()``, ``ds_tensor``, optimizer state).  Workers live in
``shard_workers.py`` and run through ``tests/support/distributed.py``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec
import pytest
import torch
from torch import nn

from shardtop.probe.names import module_names
from shardtop.probe.shards import read_shards
from shardtop.probe.shards.tree import walk
from shardtop.probe.shards.zero_optim import partition_numel
from shardtop.rundir.event_lines import encode
from shardtop.rundir.events import Shards, Tree, tree_paths
from tests.support.distributed import run_ranks
from tests.support.memory_expect import check_activations
from tests.support.shard_workers import DIM, VOCAB, TinyNet

WORKERS = "tests.support.shard_workers"
WORLD = 2
distributed = pytest.mark.timeout(600)
"""Each starts real ranks (5-15 s); all together about 3 minutes on 2 cores, plus about 80 s the
first time DeepSpeed builds its shm comm op with g++."""


# -- helpers -------------------------------------------------------------------


def reference(model: nn.Module, prefix: str = "") -> dict[str, int]:
    """Own parameter bytes per module path, shared parameters at their first owner."""
    seen: set[int] = set()
    out: dict[str, int] = {}
    for path, module in model.named_modules():
        own = 0
        for param in module.parameters(recurse=False):
            if id(param) not in seen:
                seen.add(id(param))
                own += param.numel() * param.element_size()
        out[".".join(p for p in (prefix, path) if p)] = own
    return out


def paths(result: dict[str, Any]) -> list[str]:
    tree = result["tree"]
    return tree_paths(tree["names"], tree["parents"])


def by_path(result: dict[str, Any], column: str) -> dict[str, Any]:
    values = result["shards"][column]
    return dict(zip(paths(result), values, strict=True))


def states(result: dict[str, Any]) -> dict[str, str]:
    shards = result["shards"]
    return {p: shards["states"][s] for p, s in zip(paths(result), shards["state"], strict=True) if s >= 0}


def devices(result: dict[str, Any]) -> dict[str, str]:
    shards = result["shards"]
    return {p: shards["devices"][d] for p, d in zip(paths(result), shards["device"], strict=True) if d >= 0}


def check_tree(result: dict[str, Any], prefix: str = "", root: str = "TinyNet") -> dict[str, int]:
    """The rows are the user's modules, in pre-order, with their own full sizes."""
    expected = reference(TinyNet(), prefix)
    tree = result["tree"]
    rows = dict(zip(paths(result), tree["bytes"], strict=True))
    assert list(expected) == [p for p in rows if p.startswith(prefix)]
    assert {p: rows[p] for p in expected} == expected
    assert tree["type_names"][tree["types"][paths(result).index(prefix)]] == root
    assert not any(n in tree["type_names"] for n in ("FullyShardedDataParallel", "DistributedDataParallel",
                                                      "DeepSpeedEngine", "_LightningModuleWrapperBase"))
    assert not any(n.startswith("_") or n == "module" for n in tree["names"])
    return expected


def check_sums(results: list[dict[str, Any]], column: str = "bytes", factor: int = 1) -> None:
    """Summed over ranks, each module's bytes in ``column`` are ``factor`` times its full size."""
    full = dict(zip(paths(results[0]), results[0]["tree"]["bytes"], strict=True))
    for path, size in full.items():
        total = sum(by_path(r, column)[path] for r in results)
        assert total == factor * size, (column, path, total, size)


def param_rows(result: dict[str, Any]) -> list[str]:
    return [p for p, b in zip(paths(result), result["tree"]["bytes"], strict=True) if b]


def units_by_path(result: dict[str, Any]) -> dict[str, int]:
    return by_path(result, "unit")


def unit_roots(result: dict[str, Any]) -> list[str]:
    names = paths(result)
    return [names[u["module"]] for u in result["shards"]["units"]]


def padding_bytes(result: dict[str, Any], itemsize: int = 4) -> int:
    return sum(u.get("padding", 0) for u in result["shards"]["units"]) * itemsize


def run(tmp_path: Path, name: str, **kwargs: Any) -> list[Any]:
    return run_ranks(f"{WORKERS}:{name}", WORLD, tmp_path, **kwargs)


# -- FSDP1 ---------------------------------------------------------------------

FSDP1_CASES = [
    # strategy, use_orig_params, bfloat16 MixedPrecision, sum over ranks (x full size), state
    ("FULL_SHARD", False, False, 1, "sharded"),
    ("FULL_SHARD", True, False, 1, "sharded"),
    ("SHARD_GRAD_OP", False, True, 1, "sharded"),
    ("SHARD_GRAD_OP", True, False, 1, "sharded"),
    ("NO_SHARD", False, False, WORLD, "replicated"),
]


@distributed
@pytest.mark.parametrize(("strategy", "use_orig_params", "mixed", "factor", "state"), FSDP1_CASES)
def test_fsdp1_units(
    tmp_path: Path, strategy: str, use_orig_params: bool, mixed: bool, factor: int, state: str
) -> None:
    results = run(tmp_path, "fsdp1", strategy=strategy, use_orig_params=use_orig_params, mixed=mixed)
    first = results[0]
    check_tree(first)
    check_sums(results, factor=factor)
    # Between forward and backward the FlatParameters hold gathered (bf16) tensors: same answer.
    check_tree(first["forward"])
    check_sums([r["forward"] for r in results], factor=factor)
    if not use_orig_params:  # from inside the root wrapper the FlatParameters are still registered
        check_tree(first["inner"])
        assert [r["inner"]["shards"]["bytes"] for r in results] == [r["shards"]["bytes"] for r in results]
    check_sums(results, "grad_bytes", factor=factor)
    check_sums(results, "optim_bytes", factor=factor)  # SGD momentum: one buffer per element
    for result in results:
        shards = result["shards"]
        ref = result["ref"]
        assert shards["engine"] == "fsdp1"
        assert set(states(result).values()) == {state}
        assert set(devices(result).values()) == {"cpu"}
        assert unit_roots(result) == ["", "blocks.0", "blocks.1", "blocks.2"]
        units = units_by_path(result)
        assert units["blocks.1.ff"] == units["blocks.1.norm"] == units["blocks.1"] == 2
        assert units["embed"] == units["head"] == units["blocks"] == units["act"] == 0
        assert {u["strategy"] for u in shards["units"]} == {strategy}
        # The engine's own books: FlatParameter sizes and the optimizer's state.
        assert len(shards["units"]) == ref["units"]
        assert sum(u["local_numel"] for u in shards["units"]) == ref["local_numel"]
        assert sum(u["numel"] for u in shards["units"]) == ref["full_numel"] == 239
        assert sum(shards["bytes"]) + padding_bytes(result) == 4 * ref["stored_numel"]
        # The optimizer holds the FlatParameters (padding and all) or, with use_orig_params, the originals.
        optim_padding = 0 if use_orig_params else padding_bytes(result)
        assert sum(shards["optim_bytes"]) + optim_padding == ref["optim_state_bytes"]
        info = shards["info"]
        assert info["sharding_strategy"] == strategy
        assert info["param_dtype"] == ("bfloat16" if mixed else "float32")
        assert info["use_orig_params"] is use_orig_params
        assert info["root_wrapped"] is True
        assert info["unmanaged_params"] == 0
        assert info["data_parallel_size"] == WORLD
        assert info["fsdp_units"] == 4
        # Memory by kind: the shards at rest, the sharded gradients, SGD's momentum, nothing for comm.
        kinds = result["kinds"]
        assert kinds["engine"] == {"params": 4 * ref["local_numel"], "grads": 0, "optimizer": 0, "comm": 0, "other": 0}
        assert kinds["step"] == {"params": 4 * ref["local_numel"], "grads": 4 * ref["local_numel"],
                                 "optimizer": ref["optim_state_bytes"], "comm": 0, "other": 0}
    check_activations(results, "forward", itemsize=2 if mixed else 4)


@distributed
def test_fsdp1_cpu_offload(tmp_path: Path) -> None:
    """Offloaded shards still add up; CPU-only torch cannot pin memory, so no forward here."""
    results = run(tmp_path, "fsdp1", offload=True, train=False)
    check_tree(results[0])
    check_sums(results)
    for result in results:
        assert set(states(result).values()) == {"offloaded"}
        assert all(u["offload"] for u in result["shards"]["units"])
        assert result["shards"]["info"]["offload"] is True
        assert result["shards"]["grad_bytes"] is None and result["shards"]["optim_bytes"] is None


@distributed
@pytest.mark.parametrize(
    ("mesh", "factor", "state", "strategy"),
    [([1, 2], 1, "sharded", "HYBRID_SHARD"), ([2, 1], WORLD, "replicated", "NO_SHARD")],
)
def test_fsdp1_hybrid(tmp_path: Path, mesh: list[int], factor: int, state: str, strategy: str) -> None:
    """HYBRID_SHARD over a (replicate, shard) mesh; with shards of one rank FSDP falls back to NO_SHARD."""
    results = run(tmp_path, "fsdp1", strategy="HYBRID_SHARD", hybrid_mesh=mesh)
    check_sums(results, factor=factor)
    for result in results:
        info = result["shards"]["info"]
        assert set(states(result).values()) == {state}
        assert info["sharding_strategy"] == strategy
        assert (info["replicate_group_size"], info["shard_group_size"]) == tuple(mesh)
        assert info["data_parallel_size"] == WORLD


@distributed
def test_fsdp1_hand_wrapped_blocks_leave_the_rest_whole(tmp_path: Path) -> None:
    """Story 1: only the hand-wrapped blocks are units; every other module stays whole on the CPU."""
    results = run(tmp_path, "fsdp1_hand_wrapped")
    expected = check_tree(results[0])
    wrapped = {"blocks.0.ff", "blocks.0.norm", "blocks.1.ff", "blocks.1.norm"}
    for result in results:
        shards = result["shards"]
        assert shards["engine"] == "fsdp1"
        assert unit_roots(result) == ["blocks.0", "blocks.1"]
        units = units_by_path(result)
        got = states(result)
        for path in param_rows(result):
            if path in wrapped:
                assert got[path] == "sharded" and units[path] in (0, 1)
            else:
                assert got[path] == "unsharded" and units[path] == -1
                assert by_path(result, "bytes")[path] == expected[path]
        assert units[""] == units["blocks"] == units["blocks.2"] == -1
        assert units["blocks.0"] == 0 and units["blocks.1"] == 1
        assert set(devices(result).values()) == {"cpu"}
        info = shards["info"]
        assert info["root_wrapped"] is False
        assert info["unmanaged_params"] == 6  # embed(+tied head), head.bias, blocks.2 x4
        assert info["unmanaged_bytes"] == sum(expected[p] for p in param_rows(result) if p not in wrapped)
        assert sum(u["local_numel"] for u in shards["units"]) == result["ref"]["local_numel"]
    for path in param_rows(results[0]):
        total = sum(by_path(r, "bytes")[path] for r in results)
        assert total == expected[path] * (1 if path in wrapped else WORLD)


# -- FSDP2 ---------------------------------------------------------------------


@distributed
@pytest.mark.parametrize(
    ("mesh", "offload", "factor", "state"),
    [([2], False, 1, "sharded"), ([1, 2], True, 1, "offloaded"), ([2, 1], False, WORLD, "replicated")],
)
def test_fsdp2_fully_shard(tmp_path: Path, mesh: list[int], offload: bool, factor: int, state: str) -> None:
    results = run(tmp_path, "fsdp2", mesh=mesh, offload=offload)
    check_tree(results[0])
    for column in ("bytes", "grad_bytes", "optim_bytes"):
        check_sums(results, column, factor=factor)
    for result in results:
        shards = result["shards"]
        assert shards["engine"] == "fsdp2"
        assert set(states(result).values()) == {state}
        assert sum(shards["bytes"]) == result["ref"]["local_bytes"]  # DTensor.to_local()
        assert sum(shards["optim_bytes"]) == result["ref"]["optim_state_bytes"]
        # CPUOffloadPolicy: the optimizer's state and the gradients are where the sharded parameters are
        assert shards["offloaded_optim_bytes"] == (shards["optim_bytes"] if offload else None)
        assert shards["offloaded_grad_bytes"] == (shards["grad_bytes"] if offload else None)
        assert unit_roots(result) == ["", "blocks.0", "blocks.1", "blocks.2"]
        assert sum(u["numel"] for u in shards["units"]) == 239
        info = shards["info"]
        assert info["data_parallel_size"] == WORLD
        assert info["shard_group_size"] == mesh[-1]
        assert info["offload"] is offload
        assert info["mesh_shape"] == "x".join(map(str, mesh))
        # Memory by kind: the padded local shards, gradients reduce-scattered into the same padding.
        padded = 4 * sum(u["local_numel"] for u in shards["units"])
        kinds = result["kinds"]
        assert kinds["engine"] == {"params": padded, "grads": 0, "optimizer": 0, "comm": 0, "other": 0}
        assert kinds["step"] == {"params": padded, "grads": padded, "optimizer": result["ref"]["optim_state_bytes"],
                                 "comm": 0, "other": 0}
    check_activations(results)


@distributed
def test_fsdp2_gradients_accumulated_without_sync_are_whole_on_every_rank(tmp_path: Path) -> None:
    """With the sync off each rank keeps every gradient unsharded until the micro-step that syncs."""
    results = run(tmp_path, "fsdp2_accumulating")
    check_sums([r["micro0"] for r in results], "grad_bytes", factor=WORLD)
    check_sums([r["micro1"] for r in results], "grad_bytes")


@distributed
def test_fsdp2_as_torchtitan_applies_it(tmp_path: Path) -> None:
    """Checkpoint-wrapped blocks are units, one ``fully_shard([norm, output])`` is one unit of both modules,
    and a root that owns no parameter is still wrapped."""
    results = run(tmp_path, "torchtitan_style")
    for column in ("bytes", "grad_bytes", "optim_bytes"):
        check_sums(results, column)
    for result in results:
        shards = result["shards"]
        assert shards["engine"] == "fsdp2"
        assert set(states(result).values()) == {"sharded"}
        assert sum(shards["bytes"]) == result["ref"]["local_bytes"]
        assert unit_roots(result) == ["tok_embeddings", "layers.0", "layers.1", "layers.2", "layers.3", "norm"]
        (pair,) = [u for u in shards["units"] if paths(result)[u["module"]] == "norm"]
        assert [paths(result)[row] for row in pair["also"]] == ["output"]
        assert pair["numel"] == DIM * 2 + DIM * VOCAB
        assert shards["info"]["fsdp_units"] == 6 and shards["info"]["root_wrapped"] is True


@distributed
def test_lightning_model_parallel_shards_over_data_parallel(tmp_path: Path) -> None:
    results = run(tmp_path, "lightning_fsdp2", data_parallel_size=2)
    wrapped = [r["wrapped"] for r in results]
    check_tree(wrapped[0], prefix="net", root="TinyNet")
    assert wrapped[0]["tree"]["type_names"][wrapped[0]["tree"]["types"][0]] == "Lit"
    check_sums(wrapped)
    check_sums(wrapped, "optim_bytes")
    for result in results:
        assert result["mesh"] == {"shape": [2, 1], "dims": ["data_parallel", "tensor_parallel"]}
        shards = result["wrapped"]["shards"]
        assert shards["engine"] == "fsdp2"
        assert set(states(result["wrapped"]).values()) == {"sharded"}
        assert sum(shards["bytes"]) == result["wrapped"]["ref"]["local_bytes"]
        assert shards["info"]["data_parallel_size"] == 2
        assert shards["info"]["mesh_shape"] == "2x1"
        assert result["module"]["shards"]["bytes"] == shards["bytes"]  # the LightningModule reads the same


@distributed
def test_lightning_model_parallel_default_mesh_shards_nothing(tmp_path: Path) -> None:
    """The default ModelParallelStrategy puts both CPU ranks on tensor parallel: data parallel is 1."""
    results = [r["wrapped"] for r in run(tmp_path, "lightning_fsdp2")]
    check_sums(results, factor=WORLD)
    for result in results:
        info = result["shards"]["info"]
        assert set(states(result).values()) == {"replicated"}
        assert info["data_parallel_size"] == 1
        assert info["mesh_shape"] == "1x2"
        assert info["mesh_dims"] == "data_parallel,tensor_parallel"
        assert info["world_size"] == WORLD


# -- DDP -----------------------------------------------------------------------


@distributed
def test_ddp_replicates(tmp_path: Path) -> None:
    results = run(tmp_path, "ddp")
    check_tree(results[0])
    check_sums(results, factor=WORLD)
    check_sums(results, "grad_bytes", factor=WORLD)
    for result in results:
        shards = result["shards"]
        expected = reference(TinyNet())
        assert shards["engine"] == "ddp"
        assert by_path(result, "bytes") == expected
        assert by_path(result, "grad_bytes") == expected
        assert sum(shards["optim_bytes"]) == result["ref"]["optim_state_bytes"]  # Adam, step scalars included
        assert set(states(result).values()) == {"replicated"}
        assert unit_roots(result) == [""]
        assert shards["info"]["data_parallel_size"] == WORLD
        # Memory by kind: DDP's gradient buckets are a second copy of every gradient (comm).
        full = sum(expected.values())
        assert result["kinds"]["step"] == {"params": full, "grads": full, "optimizer": 2 * full + 4 * 14,
                                           "comm": full, "other": 0}
    check_activations(results)


@distributed
def test_lightning_ddp_wrappers_vanish(tmp_path: Path) -> None:
    results = run(tmp_path, "lightning_ddp")
    for result in results:
        wrapped = result["wrapped"]
        check_tree(wrapped, prefix="net")
        assert wrapped["tree"]["names"][0] == "" and wrapped["tree"]["parents"][0] == -1
        assert wrapped["shards"]["engine"] == "ddp"
        assert set(states(wrapped).values()) == {"replicated"}
        assert result["module"]["shards"]["bytes"] == wrapped["shards"]["bytes"]
    check_sums([r["wrapped"] for r in results], factor=WORLD)


# -- DeepSpeed -----------------------------------------------------------------


@distributed
def test_zero3_on_one_rank_holds_each_parameter_once(tmp_path: Path) -> None:
    """A data-parallel group of one, in bf16 (as TRL's zero3.yaml runs on one GPU): DeepSpeed gathers a
    parameter by viewing its partition, so a persistent parameter is held once, not whole beside its
    partition.  The shard table and the memory split, two sources, say the same bytes."""
    (result,) = run_ranks(f"{WORKERS}:deepspeed_zero", 1, tmp_path, stage=3, bf16=True)
    for stage in ("step", "step_passed_optimizer"):
        held = result[stage]
        assert set(states(held).values()) == {"persistent"}
        check_sums([held], factor=1)
        assert held["shards"]["info"]["persistent_bytes"] == 0  # nothing beside the partitions
    tree_bytes = sum(result["step"]["tree"]["bytes"])
    assert result["kinds"]["step"]["params"] == sum(result["step"]["shards"]["bytes"]) == tree_bytes
    assert result["kinds"]["step"]["grads"] == sum(result["step"]["shards"]["grad_bytes"])


@distributed
def test_zero3_built_outside_zero_init(tmp_path: Path) -> None:
    """Story 2: whole on every rank before the engine; after it, TinyNet's tensors are all under
    ZeRO-3's default persistence threshold (1e5 elements): each rank holds its partition of each, and
    from the first forward on the whole parameter beside it."""
    results = run(tmp_path, "deepspeed_zero", stage=3)
    setup = [r["setup"] for r in results]
    check_tree(setup[0])
    check_sums(setup, factor=WORLD)
    assert {r["shards"]["engine"] for r in setup} == {"plain"}
    assert set(states(setup[0]).values()) == {"unsharded"}
    model_bytes = sum(setup[0]["tree"]["bytes"])
    for stage in ("engine", "step", "step_passed_optimizer"):
        staged = [r[stage] for r in results]
        check_tree(staged[0])
        gathered = stage != "engine"  # not gathered before the first forward
        check_sums(staged, factor=1 + WORLD * gathered)  # the partitions, and each rank's whole copy
        for result in staged:
            shards = result["shards"]
            assert shards["engine"] == "zero3"
            assert set(states(result).values()) == {"persistent"}
            assert unit_roots(result) == [""]
            info = shards["info"]
            assert info["zero_stage"] == 3 and info["data_parallel_size"] == WORLD
            assert info["persistence_threshold"] == 100_000
            assert (info["persistent_params"], info["persistent_bytes"]) == (14, model_bytes)
            assert info["gathered_params"] == 0  # persistent ones are not counted as gathered
    # fp32 master only before the first step; master + Adam's two moments after it.
    check_sums([r["engine"] for r in results], "optim_bytes", factor=1)
    check_sums([r["step"] for r in results], "optim_bytes", factor=3)
    check_sums([r["step_passed_optimizer"] for r in results], "optim_bytes", factor=3)
    # ZeRO-3's gradient partitions (a persistent buffer, param.grad stays None) per module, after the step.
    check_sums([r["step"] for r in results], "grad_bytes")
    check_sums([r["backward"] for r in results], "grad_bytes")
    check_activations(results, "backward")
    partition = 4 * 120  # 239 elements padded to 240, split in two
    for result in results:
        kinds = result["kinds"]
        # Set up: the partition, the gradient buffer, the fp32 master, the reduce bucket (5e8 elements,
        # DeepSpeed's default reduce_bucket_size, allocated by the optimizer at set-up).
        assert kinds["engine"] == {"params": partition, "grads": partition, "optimizer": partition,
                                   "comm": 4 * 500_000_000, "other": 0}
        # After the step: every parameter gathered whole beside its partition (they are under the
        # persistence threshold; one all-gather output padded to an even size), Adam's two moments.
        assert kinds["step"]["params"] == partition + 4 * (239 + 1)
        assert kinds["step"]["optimizer"] == 3 * partition + 4  # master, exp_avg, exp_avg_sq, the step count
        assert kinds["step"]["grads"] == partition


@distributed
def test_zero3_zero_init_with_param_offload(tmp_path: Path) -> None:
    results = run(tmp_path, "deepspeed_zero", stage=3, zero_init=True, offload_param="cpu", persist=False)
    setup = [r["setup"] for r in results]
    check_tree(setup[0])
    check_sums(setup)
    for result in setup:
        assert result["shards"]["engine"] == "zero3"
        assert result["shards"]["info"]["zero_init"] is True
        assert set(states(result).values()) == {"sharded"}
        assert sum(result["shards"]["bytes"]) + padding_bytes(result) == result["ref"]["stored_bytes"]
    for stage in ("engine", "step"):
        staged = [r[stage] for r in results]
        check_sums(staged)
        for result in staged:
            assert set(states(result).values()) == {"offloaded"}
            assert result["shards"]["info"]["offload_param"] == "cpu"
            assert result["shards"]["units"][0]["offload"] is True
            assert result["shards"]["info"]["gathered_params"] == 0


@distributed
@pytest.mark.parametrize("stage", [2, 3])
def test_zero_offload_optimizer_holds_its_state_and_gradients_in_host_memory(tmp_path: Path, stage: int) -> None:
    """``offload_optimizer: cpu`` on 2 gloo ranks: DeepSpeed keeps the fp32 master partition, Adam's moments and
    an fp32 gradient beside the master on the host (ZeRO-3 its flat gradient buffer too), and says so
    (``cpu_offload``, ``offload_optimizer``), although on CPU processes every tensor is on ``cpu``: all of it is
    offloaded, per module, while the parameters stay where the engine keeps them (not offloaded)."""
    results = run(tmp_path, "deepspeed_zero", stage=stage, persist=False, offload_optimizer="cpu")
    steps = [r["step"] for r in results]
    for column in ("optim_bytes", "offloaded_optim_bytes"):
        check_sums(steps, column, factor=3)  # master, exp_avg, exp_avg_sq: each this rank's slice
    for column in ("grad_bytes", "offloaded_grad_bytes"):  # ZeRO-3: its gradient buffer and the master's
        check_sums(steps, column, factor=1 if stage == 2 else 2)
    for result in steps:
        shards = result["shards"]
        assert shards["info"]["offload_optimizer"] == "cpu" and shards["info"]["offload_param"] == "none"
        assert set(states(result).values()) == {"replicated" if stage == 2 else "sharded"}
        if stage == 2:
            assert all(u["offload"] for u in shards["units"])


@distributed
@pytest.mark.parametrize(("stage", "bf16"), [(1, False), (2, False), (1, True)])
def test_zero12_partition_the_optimizer(tmp_path: Path, stage: int, bf16: bool) -> None:
    """Whole parameters everywhere, optimizer state split; bf16 ZeRO-1 goes through ``BF16_Optimizer``."""
    results = run(tmp_path, "deepspeed_zero", stage=stage, bf16=bf16)
    itemsize = 2 if bf16 else 4
    for when in ("engine", "step"):
        staged = [r[when] for r in results]
        check_sums(staged, factor=WORLD)
        # fp32 master before the first step; master + Adam's two fp32 moments after it.
        check_sums(staged, "optim_bytes", factor=(4 if when == "engine" else 12) // itemsize)
        if bf16:  # BF16_Optimizer keeps a full fp32 gradient buffer on every rank
            check_sums(staged, "grad_bytes", factor=WORLD * 4 // itemsize)
        for result in staged:
            shards = result["shards"]
            assert shards["engine"] == f"zero{stage}"
            assert set(states(result).values()) == {"replicated"}
            [unit] = shards["units"]
            assert unit["kind"] == "zero-optimizer" and unit["numel"] == 239
            assert unit["local_numel"] == 120  # 239 padded to 240, split in two
            info = shards["info"]
            assert info["zero_stage"] == stage and info["partition_count"] == WORLD
            assert info["param_dtype"] == ("bfloat16" if bf16 else "float32")
            assert info["optimizer"] == ("BF16_Optimizer" if bf16 else "DeepSpeedZeroOptimizer")
            assert sum(shards["bytes"]) == result["ref"]["stored_bytes"]
    check_activations(results, "backward", itemsize=itemsize)
    flat = itemsize * 240  # the parameters live in one flat buffer, padded to split evenly
    if bf16:  # BF16_Optimizer: a full fp32 gradient buffer, and param.grad (bf16) until the step
        check_sums([r["backward"] for r in results], "grad_bytes", factor=WORLD * 4 // itemsize + WORLD)
        assert {r["kinds"]["backward"]["grads"] for r in results} == {4 * 240 + 2 * 239}
        return
    # ZeRO-1/2: this rank's slice of each gradient, from the end of the backward to the step.
    check_sums([r["backward"] for r in results], "grad_bytes")
    for result in results:
        kinds = result["kinds"]
        assert kinds["engine"] == {"params": flat, "grads": 0, "optimizer": 4 * 120, "comm": 0, "other": 0}
        assert kinds["backward"]["grads"] == 4 * 120
        assert kinds["step"] == {"params": flat, "grads": 0, "optimizer": 3 * 4 * 120 + 4, "comm": 0, "other": 0}


# -- one process ---------------------------------------------------------------


def test_plain_model_with_optimizer() -> None:
    model = TinyNet()
    optimizer = torch.optim.Adam(model.parameters())
    model(torch.randint(0, 11, (2, 3))).sum().backward()
    optimizer.step()
    tree, shards = read_shards(model, tree_id=3, stage="step", optimizer=optimizer)
    result = {"tree": msgspec.to_builtins(tree), "shards": msgspec.to_builtins(shards)}
    expected = check_tree(result)
    assert (tree.tree_id, shards.tree_id, shards.engine, shards.stage) == (3, 3, "plain", "step")
    assert by_path(result, "bytes") == expected == by_path(result, "grad_bytes")
    # Adam: exp_avg and exp_avg_sq per element, plus a 4-byte step per parameter tensor.
    assert by_path(result, "optim_bytes")["blocks.0.ff"] == 2 * expected["blocks.0.ff"] + 2 * 4
    assert sum(shards.optim_bytes or []) == sum(
        t.numel() * t.element_size() for s in optimizer.state.values() for t in s.values()
    )
    assert set(states(result).values()) == {"unsharded"} and shards.units == []
    assert shards.info == {"devices": "cpu"}
    assert shards.grad_bytes is not None and shards.device[0] == -1 and shards.state[0] == -1


def test_manual_placement_across_devices() -> None:
    """Modules put on different devices by hand; the meta device stores nothing."""
    model = TinyNet()
    model.blocks[1].to("meta")
    model.blocks[2].to("meta")
    tree, shards = read_shards(model, tree_id=0, stage="setup")
    result = {"tree": msgspec.to_builtins(tree), "shards": msgspec.to_builtins(shards)}
    expected = check_tree(result)
    assert shards.engine == "manual"
    assert shards.info["devices"] == "cpu,meta"
    on = devices(result)
    got = states(result)
    for path in param_rows(result):
        meta = path.startswith(("blocks.1", "blocks.2"))
        assert on[path] == ("meta" if meta else "cpu")
        assert got[path] == ("meta" if meta else "unsharded")
        assert by_path(result, "bytes")[path] == (0 if meta else expected[path])


def test_wrappers_fold_and_shared_modules_count_once() -> None:
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper

    inner = TinyNet()
    inner.blocks[0] = checkpoint_wrapper(inner.blocks[0])
    inner.again = inner.blocks[2]  # the same module under two names: one row
    compiled = torch.compile(inner, backend="eager")
    tree = walk(compiled)
    names = tree_paths(tree.names, tree.parents)
    assert names[:5] == ["", "embed", "blocks", "blocks.0", "blocks.0.ff"]
    assert "again" not in names and len(names) == len(set(names))
    assert [type(w).__name__ for w, _ in tree.wrappers] == ["OptimizedModule", "CheckpointWrapper"]
    assert tree.row_of[id(compiled)] == 0 and tree.row_of[id(inner.blocks[0])] == 3
    assert len(tree.params) == 14  # 15 registrations, the tied head weight counted once
    # OOM attribution names modules with names.py; the tree must use the same paths.
    assert set(module_names(compiled).values()) == set(names)


def test_deep_chain_needs_no_recursion() -> None:
    model: nn.Module = nn.Linear(1, 1)
    for _ in range(5000):
        model = nn.Sequential(model)
    tree, _ = read_shards(model, tree_id=0, stage="setup")
    assert len(tree.names) == 5001 and tree.parents[-1] == 4999 and tree.params[-1] == 2


def test_zero3_partition_arithmetic() -> None:
    assert [partition_numel(35, 18, r) for r in range(2)] == [18, 17]
    assert [partition_numel(1, 1, r) for r in range(3)] == [1, 0, 0]
    assert sum(partition_numel(239, 60, r) for r in range(4)) == 239


class Cell(nn.Module):
    """A Linear(2, 2)'s parameters without its slow initialisation, so the model builds in a second."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(2, 2))
        self.bias = nn.Parameter(torch.empty(2))


def test_100k_modules_read_whole_and_encode_small() -> None:
    """Every module a row, every byte counted, under 10 MB encoded (the time it takes:
    ``bench/bench_probe.py``, ``bench/bench_costs.py``)."""
    model = nn.Sequential(*(nn.Sequential(*(Cell() for _ in range(100))) for _ in range(1000)))
    tree, shards = read_shards(model, tree_id=0, stage="setup")
    assert len(tree.names) == 101_001
    size = len(encode(tree)) + len(encode(shards))
    assert size < 10_000_000, size
    assert isinstance(msgspec.json.decode(encode(tree)), dict)
    assert sum(shards.bytes) == sum(tree.bytes) == 100_000 * 6 * 4
    assert isinstance(tree, Tree) and isinstance(shards, Shards)
