"""Memory by kind through the probe's events, with real engines on 2 gloo ranks.

``test_shards.py`` checks each memory source against each engine in the shard
readers' processes; here the whole probe runs as a user's job would (the
Lightning callback, the raw API) and the events it wrote are read back.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from shardtop.rundir.event_files import read_all
from shardtop.rundir.events import Memory, Oom, Shards, Tree, tree_paths
from shardtop.rundir.memory_figures import MemorySplit
from tests.support.distributed import run_ranks
from tests.support.memory_expect import saved_by_the_loss, saved_per_module

WORKERS = "tests.support.shard_workers"
distributed = pytest.mark.timeout(600)


def events_of(run: Path, rank: int) -> list[object]:
    events, skipped = read_all(run / "events")
    assert sum(skipped.values()) == 0
    return [e for e in events if getattr(e, "rank", None) == rank]


def paths_of(events: list[object], shards: Shards) -> list[str]:
    tree = [e for e in events if isinstance(e, Tree) and e.tree_id == shards.tree_id][-1]
    return tree_paths(tree.names, tree.parents)


def phase_splits(events: list[object]) -> dict[tuple[int | None, str], MemorySplit]:
    return {
        (e.split.step, e.split.phase): e.split for e in events if isinstance(e, Memory) and e.split and e.split.phase
    }


@distributed
def test_lightning_snapshots_after_configure_model_and_explains_the_first_steps(tmp_path: Path) -> None:
    run_ranks(f"{WORKERS}:lightning_probe", 2, tmp_path)
    tokens = 2 * 5  # batches of 2 sequences of 5
    for rank in (0, 1):
        events = events_of(tmp_path / "run", rank)
        shards = [e for e in events if isinstance(e, Shards)]
        # The set-up hook sees the plain model; configure_model shards it before the strategy's set-up.
        assert [(s.stage, s.engine) for s in shards] == [("setup", "plain"), ("setup", "fsdp2"), ("engine", "fsdp2"),
                                                         ("step", "fsdp2")]
        step = shards[-1]
        assert step.act_bytes is not None
        act = {p: b for p, b in zip(paths_of(events, step), step.act_bytes, strict=True) if b}
        assert act == saved_per_module(tokens=tokens, prefix="net.")
        splits = phase_splits(events)
        # Lightning divides the loss by ``accumulate_grad_batches``; the division keeps that number as a
        # 0-dim int64 tensor (8 bytes), outside every module.
        forward = sum(act.values()) + saved_by_the_loss(tokens) + 8
        assert splits[(1, "backward")].by_kind.activations == forward
        assert splits[(2, "backward")].by_kind.activations == forward
        assert all(split.by_kind.activations is None for (step, _), split in splits.items() if step and step > 2)
        padded = 4 * sum(u.local_numel for u in step.units)
        assert splits[(2, "optimizer")].by_kind.params == padded
        assert splits[(2, "optimizer")].by_kind.grads == padded


@distributed
def test_zero2_gradient_partitions_reach_the_step_snapshot(tmp_path: Path) -> None:
    """ZeRO-2 frees its gradient partitions inside the step: the probe reports them as held before it."""
    run_ranks(f"{WORKERS}:probe_zero", 2, tmp_path, stage=2)
    totals: dict[str, int] = {}
    for rank in (0, 1):
        events = events_of(tmp_path / "run", rank)
        step = [e for e in events if isinstance(e, Shards) and e.stage == "step"][-1]
        tree = [e for e in events if isinstance(e, Tree)][-1]
        assert step.grad_bytes is not None and step.act_bytes is not None
        for path, full, grads in zip(tree_paths(tree.names, tree.parents), tree.bytes, step.grad_bytes, strict=True):
            totals[path] = totals.get(path, 0) + grads
            assert grads <= full
        splits = phase_splits(events)
        assert splits[(1, "optimizer")].by_kind.grads == 4 * 120  # this rank's partition of 240 padded elements
        assert splits[(1, "step")].by_kind.grads == 0
        assert splits[(1, "step")].by_kind.optimizer == 3 * 4 * 120 + 4  # master, Adam's two moments, a step count
    full = dict(zip(tree_paths(tree.names, tree.parents), tree.bytes, strict=True))
    assert totals == full  # summed over the ranks, every module's whole gradient


@distributed
def test_an_oom_inside_a_zero_optimizer_counts_its_buffers(tmp_path: Path) -> None:
    [result] = run_ranks(f"{WORKERS}:zero_oom_on_stack", 1, tmp_path)
    [oom] = [e for e in events_of(tmp_path / "run", 0) if isinstance(e, Oom)]
    assert oom.memory is not None
    kinds = oom.memory.by_kind
    assert kinds.optimizer == result["master_bytes"] > 0  # the fp32 master, found through the failing frame's self
    assert kinds.params == 4 * 240  # the flat parameters (padded), not the model's own 239 elements again
    assert kinds.comm == 0 and kinds.grads == 0
