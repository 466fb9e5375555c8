"""DeepSpeed's ZeRO optimizers: which slice of the optimizer state this rank owns.

ZeRO-1/2 (``DeepSpeedZeroOptimizer``, and ``BF16_Optimizer`` which DeepSpeed
picks for bf16 ZeRO-1 with fp32 gradient accumulation) flatten each parameter
group; rank *r* owns elements ``[r * partition, (r + 1) * partition)`` of the
flat group as an fp32 master copy plus the optimizer's state tensors of the
same size.  ZeRO-3's optimizer keeps one fp32 partition per sub-group, made of
each parameter's own partition.

Gradients are partitioned too, and ``param.grad`` stays None: ZeRO-1/2 keep
this rank's slice of each parameter's gradient in ``averaged_gradients`` (one
list per group, aligned with ``params_in_partition``) from the end of the
backward until the step frees it; ZeRO-3 keeps one persistent buffer,
``grad_partitions_flat_buffer``, cut into each parameter's partition.  Where
such an optimizer exists, a module without gradient partitions now holds 0
bytes of gradients, not an unknown amount.

Counted per module: for every element of the module's parameters inside this
rank's slice, the master element plus one element of each state tensor as
large as the slice (Adam's ``exp_avg`` and ``exp_avg_sq``).  Partition padding
and scalar states are attributed to no module.

Where each lives is the engine's own word, not the tensors' device (on CPU
processes every tensor is on ``cpu``): ``offload_optimizer`` puts the master
partitions and their state in host memory (ZeRO-1/2: ``cpu_offload``; ZeRO-3:
``offload_optimizer``, per sub-group ``subgroup_to_device``, or NVMe where it
swaps them out), and ZeRO-3 then keeps its flat gradient buffer there too
(``optimizer.device``); both keep an fp32 gradient on each offloaded master
partition between steps (ZeRO-1/2's only gradient partition when it
offloads).  Those are counted as offloaded
(``ShardTable.add_grad``/``add_optim``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from shardtop.probe.shards.placement import add_plain
from shardtop.probe.shards.table import REPLICATED, ShardTable, dtype_name
from shardtop.probe.shards.tree import ModuleTree
from shardtop.rundir.events import Unit


def is_zero_optimizer(optimizer: Any) -> bool:
    return any(
        hasattr(optimizer, name)
        for name in ("fp32_partitioned_groups_flat", "single_partition_of_fp32_groups", "fp32_groups_flat_partition")
    )


class Ranks:
    """This process's rank in each process group, asked once per group."""

    def __init__(self) -> None:
        self._cache: dict[int, int] = {}

    def of(self, group: Any) -> int:
        key = id(group)
        found = self._cache.get(key)
        if found is None:
            import torch.distributed as dist

            found = dist.get_rank(group) if dist.is_available() and dist.is_initialized() else 0
            found = self._cache[key] = max(found, 0)
        return found

    def size(self, group: Any) -> int:
        import torch.distributed as dist

        return dist.get_world_size(group) if dist.is_available() and dist.is_initialized() else 1


def partition_numel(numel: int, partition: int, rank: int) -> int:
    """Elements of a ZeRO-3 parameter in ``rank``'s partition, padding excluded."""
    return max(0, min(partition, numel - rank * partition))


def per_element_bytes(optimizer: Any, master: Any) -> int:
    """Bytes per element of a partition: the fp32 master plus each state tensor as large as it."""
    size: int = master.element_size()
    inner = getattr(optimizer, "optimizer", None)
    state = getattr(inner, "state", {}).get(master, {}) if inner is not None else {}
    for value in state.values():
        if hasattr(value, "numel") and value.numel() == master.numel() and value.numel() > 1:
            size += value.element_size()
    return size


@dataclass
class FlatGroup:
    """One flattened parameter group of a ZeRO-1/2 optimizer, seen from this rank."""

    params: list[Any]
    sizes: list[int]
    offsets: list[int]
    partition: int
    rank: int
    master: Any
    grads: list[Any] | None = None
    """Full-size fp32 gradient buffers kept per parameter (``BF16_Optimizer``), if any."""


def flat_groups(optimizer: Any) -> list[FlatGroup]:
    """The groups of a ``DeepSpeedZeroOptimizer`` or a ``BF16_Optimizer``; [] for anything else."""
    ranks = Ranks()
    out: list[FlatGroup] = []
    if hasattr(optimizer, "single_partition_of_fp32_groups"):
        groups = getattr(optimizer, "round_robin_bit16_groups", None) or optimizer.bit16_groups
        dp_groups = getattr(optimizer, "real_dp_process_group", None) or [None] * len(groups)
        for i, group in enumerate(groups):
            sizes = _sizes(getattr(optimizer, "round_robin_bit16_meta", None), i, group)
            offsets = _offsets(getattr(optimizer, "round_robin_bit16_offsets", None), i, sizes)
            master = optimizer.single_partition_of_fp32_groups[i]
            out.append(FlatGroup(list(group), sizes, offsets, int(optimizer.partition_size[i]),
                                 ranks.of(dp_groups[i]), master))
    elif hasattr(optimizer, "fp32_groups_flat_partition") and hasattr(optimizer, "bf16_groups"):
        dp_groups = getattr(optimizer, "real_dp_process_group", None) or [None] * len(optimizer.bf16_groups)
        grads = getattr(optimizer, "fp32_groups_gradients", None)
        for i, group in enumerate(optimizer.bf16_groups):
            sizes = [p.numel() for p in group]
            partition = optimizer.bf16_groups_flat[i].numel() // max(1, ranks.size(dp_groups[i]))
            out.append(FlatGroup(list(group), sizes, _offsets(None, i, sizes), partition, ranks.of(dp_groups[i]),
                                 optimizer.fp32_groups_flat_partition[i], grads[i] if grads else None))
    return out


def _sizes(metas: Any, index: int, group: list[Any]) -> list[int]:
    """Full sizes; DeepSpeed keeps meta copies because state offload may empty ``param.data``."""
    if metas is not None and index < len(metas) and len(metas[index]) == len(group):
        return [m.numel() for m in metas[index]]
    return [p.numel() for p in group]


def _offsets(offsets: Any, index: int, sizes: list[int]) -> list[int]:
    if offsets is not None and index < len(offsets) and len(offsets[index]) == len(sizes):
        return list(offsets[index])
    out, position = [], 0  # older DeepSpeed, BF16_Optimizer: parameters back to back
    for size in sizes:
        out.append(position)
        position += size
    return out


def read_optimizer_partitions(tree: ModuleTree, table: ShardTable, optimizer: Any, stage: int) -> bool:
    """ZeRO-1/2: whole parameters, one unit per flat group holding this rank's slice; False if unknown."""
    groups = flat_groups(optimizer)
    if not groups:
        return False
    claimed: set[int] = set()
    table.optim_bytes = table.optim_bytes or [0] * len(tree)
    replicated = table.state_id(REPLICATED)
    offloaded = offloads_optimizer(optimizer)
    for group in groups:
        per_element = per_element_bytes(optimizer, group.master)
        master_grad = getattr(group.master, "grad", None) if offloaded else None  # kept between steps when offloaded
        low, high = group.rank * group.partition, (group.rank + 1) * group.partition
        unit = table.add_unit(Unit(module=0, kind="zero-optimizer", numel=0, local_numel=0))
        held = 0
        for j, (param, numel, offset) in enumerate(zip(group.params, group.sizes, group.offsets, strict=True)):
            overlap = max(0, min(offset + numel, high) - max(offset, low))
            held += overlap
            row = tree.row_of_param(param)
            if row < 0 or id(param) in claimed:
                continue
            claimed.add(id(param))
            table.add(row, numel, param.numel(), param.element_size(), table.device_id(param.device), replicated, unit)
            table.add_optim(row, overlap * per_element, offloaded)
            if group.grads is not None and j < len(group.grads):
                table.add_grad(row, group.grads[j].numel() * group.grads[j].element_size())
            if master_grad is not None:  # the gradient partition, in host memory beside its master
                table.add_grad(row, overlap * master_grad.element_size(), True)
        table.units[unit] = Unit(
            module=0,
            kind="zero-optimizer",
            numel=sum(group.sizes),
            local_numel=group.partition,
            padding=group.partition - held,
            strategy=f"zero{stage}",
            offload=offloaded,
            dtype=dtype_name(group.master.dtype),
            params=len(group.params),
        )
    rest = [i for i, p in enumerate(tree.params) if id(p) not in claimed]
    add_plain(tree, table, rest, REPLICATED)  # frozen parameters: whole everywhere, in no partition
    add_gradient_partitions(tree, table, optimizer)
    return True


def add_gradient_partitions(tree: ModuleTree, table: ShardTable, optimizer: Any) -> None:
    """ZeRO-1/2: this rank's slice of each parameter's gradient, while the optimizer holds them."""
    if table.grad_bytes is None:
        table.grad_bytes = [0] * len(tree)
    partitions = getattr(optimizer, "params_in_partition", None)
    averaged = getattr(optimizer, "averaged_gradients", None)
    if not partitions or not isinstance(averaged, dict):
        return
    for index, params in enumerate(partitions):
        grads = averaged.get(index)
        if not isinstance(grads, (list, tuple)) or len(grads) < len(params):
            continue
        for param, grad in zip(params, grads, strict=False):  # a last, extra tensor is the partition's padding
            row = tree.row_of_param(param)
            if row >= 0 and grad is not None and hasattr(grad, "element_size"):
                table.add_grad(row, grad.numel() * grad.element_size())


def offloads_optimizer(optimizer: Any) -> bool:
    """The ZeRO optimizer keeps its master partitions and state in host memory (or NVMe), as it says:
    ZeRO-3's ``offload_optimizer``, ZeRO-1/2's ``cpu_offload``."""
    return bool(getattr(optimizer, "offload_optimizer", False) or getattr(optimizer, "cpu_offload", False))


def offloaded_sub_group(optimizer: Any, index: int) -> bool:
    """ZeRO-3: sub-group ``index``'s master partition and state are offloaded.  With a partial offload
    (``offload_optimizer.ratio`` < 1) DeepSpeed keeps the first sub-groups on the accelerator and names each
    one's place in ``subgroup_to_device``; an NVMe offload swaps them all out."""
    if not getattr(optimizer, "offload_optimizer", False):
        return False
    places = getattr(optimizer, "subgroup_to_device", None)
    if getattr(optimizer, "swap_optimizer", False) or not isinstance(places, dict) or index not in places:
        return True
    return str(places[index]) == "cpu"


def add_stage3_optimizer(tree: ModuleTree, table: ShardTable, optimizer: Any) -> None:
    """ZeRO-3: each parameter's slice of its sub-group's fp32 partition and state, and of the gradients."""
    groups = getattr(optimizer, "fp16_groups", None)
    flats = getattr(optimizer, "fp32_partitioned_groups_flat", None)
    if not groups or not flats:
        return
    ranks = Ranks()
    table.optim_bytes = table.optim_bytes or [0] * len(tree)
    table.grad_bytes = table.grad_bytes or [0] * len(tree)
    grad_partitions = getattr(optimizer, "_DeepSpeedZeroOptimizer_Stage3__param_id_to_grad_partition", None) or {}
    grads_offloaded = bool(getattr(optimizer, "offload_optimizer", False))  # the flat buffer is on ``.device``
    for index, (group, flat) in enumerate(zip(groups, flats, strict=True)):
        per_element = per_element_bytes(optimizer, flat)
        offloaded = offloaded_sub_group(optimizer, index)
        master_grad = getattr(flat, "grad", None) if offloaded else None  # kept between steps when offloaded
        for param in group:
            row = tree.row_of_param(param)
            part = getattr(param, "ds_tensor", None)
            if row < 0 or part is None:
                continue
            partition = int(getattr(part, "ds_numel", part.numel()))
            local = partition_numel(int(param.ds_numel), partition, ranks.of(getattr(param, "ds_process_group", None)))
            table.add_optim(row, local * per_element, offloaded)
            grad = grad_partitions.get(getattr(param, "ds_id", None))
            if grad is not None:  # this rank's partition of the gradient, padding excluded
                table.add_grad(row, min(grad.numel(), local) * grad.element_size(), grads_offloaded)
            if master_grad is not None:
                table.add_grad(row, local * master_grad.element_size(), True)
