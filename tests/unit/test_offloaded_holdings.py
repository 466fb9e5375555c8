"""What a GPU rank holds on its device, apart from what its engine offloads to host memory.

The events are shaped as the probe writes them for a GPU rank of ZeRO-3 under ``offload_optimizer``
(``tests/engines/test_shards.py`` and ``test_offload.py`` check the probe's lists on real runs): parameter
partitions on ``cuda:0``, every gradient and optimizer byte also in the offloaded lists.  The plan against
the run, the rank's device figures and the shard tree's columns leave those out on a GPU rank; on a CPU
process the plan against the run counts them, as the plan for CPU processes does.
"""

from __future__ import annotations

import msgspec

from shardtop.read.run_fold import fold
from shardtop.read.run_model import RunModel
from shardtop.read.shard_model import ShardModel
from shardtop.rundir.events import Event, Exit, Hello, Memory, Phase, Planned, PlannedRank, Shards, Step, Tree, Unit
from shardtop.rundir.run_config import RunConfig
from shardtop.rundir.run_meta import RunMeta

MiB = 1 << 20
PARTITION = (0, 4 * MiB, 4 * MiB)
"""This rank's parameter partition of each row: the root, then two layers."""
GRADS = (0, 8 * MiB, 8 * MiB)
"""ZeRO-3's fp32 gradient partition and the master's fp32 gradient, both on the host under the offload."""
STATES = (0, 12 * MiB, 12 * MiB)
"""The fp32 master partition and Adam's two moments, on the host."""


def _events(device: str, offloaded: bool = True) -> list[Event]:
    tree = Tree(tree_id=0, names=["", "0", "1"], parents=[-1, 0, 0], types=[0, 1, 1],
                type_names=["Sequential", "Linear"], params=[0, 2 * MiB, 2 * MiB], bytes=[0, 8 * MiB, 8 * MiB])
    shards = Shards(
        tree_id=0, engine="zero3", stage="step", devices=[device], states=["sharded"], bytes=list(PARTITION),
        device=[-1, 0, 0], state=[-1, 0, 0], unit=[0, 0, 0],
        units=[Unit(module=0, kind="zero3", numel=4 * MiB, local_numel=2 * MiB)], grad_bytes=list(GRADS),
        optim_bytes=list(STATES), offloaded_grad_bytes=list(GRADS) if offloaded else None,
        offloaded_optim_bytes=list(STATES) if offloaded else None,
        info={"zero_stage": 3, "offload_optimizer": "cpu" if offloaded else "none"},
    )
    planned = Planned(strategy="ZeRO-3, fp32, optimizer offload", engine="zero3", model="Sequential", params=4 * MiB,
                      batch_size=8, devices=2, accelerator=device.split(":")[0],
                      per_rank=PlannedRank(params=8 * MiB, grads=0, optimizer=0, activations=0, peak=10 * MiB,
                                           peak_phase="backward"))
    events: list[Event] = [
        Hello(pid=100, world_size=2, device=device, engine="zero3"), tree, planned, Phase(phase="backward", step=2),
        shards, Step(step=2), Exit(code=0, status="ok"),
    ]
    if device.startswith("cuda"):
        events.insert(-1, Memory(device=device, allocated=9 * MiB, peak=10 * MiB))
    return [msgspec.structs.replace(e, rank=0, host="box", t=float(i)) for i, e in enumerate(events)]


def _model(device: str, offloaded: bool = True) -> RunModel:
    return RunModel.of(fold(_events(device, offloaded)), RunMeta(config=RunConfig(world_size=2)))


def test_a_gpu_rank_holds_on_its_device_what_the_engine_did_not_offload() -> None:
    (rank,) = _model("cuda:0").ranks
    assert (rank.param_bytes, rank.grad_bytes, rank.optim_bytes) == (8 * MiB, 16 * MiB, 24 * MiB), "held anywhere"
    assert (rank.offloaded.params, rank.offloaded.grads, rank.offloaded.optimizer) == (0, 16 * MiB, 24 * MiB)
    here = rank.on_device
    assert (here.params, here.grads, here.optimizer) == (8 * MiB, 0, 0)


def test_the_plan_against_a_gpu_rank_leaves_the_offloaded_state_out_as_the_plan_does() -> None:
    check = _model("cuda:0").plan_check
    assert check is not None
    (measured,) = [c.measured for c in check.ranks]
    assert (measured.params, measured.grads, measured.optimizer) == (8 * MiB, None, 0)
    assert check.ranks[0].errors["optimizer"] is None, "0 measured: no relative error to give"


def test_on_a_cpu_process_the_plan_against_the_run_counts_the_offloaded_state_on_the_rank() -> None:
    """Host memory is a CPU process's own: the plan for CPU processes counts what an offload moves on the rank,
    and the run is measured alike."""
    check = _model("cpu").plan_check
    assert check is not None
    (measured,) = [c.measured for c in check.ranks]
    assert (measured.grads, measured.optimizer) == (16 * MiB, 24 * MiB)


def test_the_tree_columns_count_the_device_and_offer_what_is_offloaded() -> None:
    state = fold(_events("cuda:0"))
    model = ShardModel.of(state)
    assert model is not None and "offloaded" in model.figures
    assert model.node_figure(0, 0, "optimizer") == 0 and model.node_figure(0, 0, "grads") == 0
    assert model.node_figure(0, 0, "offloaded") == 40 * MiB
    assert model.node_figure(0, 0, "total") == 8 * MiB, "the parameters on the device"
    plain = ShardModel.of(fold(_events("cuda:0", offloaded=False)))
    assert plain is not None and "offloaded" not in plain.figures
    assert plain.node_figure(0, 0, "optimizer") == 24 * MiB and plain.node_figure(0, 0, "total") == 48 * MiB
