"""FSDP1 (``FullyShardedDataParallel``): units, their FlatParameters, and what is left out.

Each FSDP wrapper is one unit.  Its ``FlatParamHandle`` holds one
``FlatParameter`` with the unit's own parameters: those of the wrapped module's
subtree that no nested unit took.  With ``use_orig_params=False`` the original
parameters are gone from the modules, so sizes come from the FlatParameter's
metadata (``_param_infos`` names each original's module, ``_numels`` its full
size, ``_shard_param_infos`` how much of it lies in this rank's shard).

Parameters in no unit stay whole wherever the user left them (story 1: layers
wrapped by hand, the root not wrapped, everything else on the CPU); they are
accounted as ``unsharded`` with unit -1 and summed in ``info``.

The private attributes read here exist from torch 2.1 to 2.14; every read is a
``getattr`` with a fallback.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from shardtop.probe.shards.optim import Split, add_grads, add_optimizer_state, add_split
from shardtop.probe.shards.placement import add_plain
from shardtop.probe.shards.quantized import held_quant_state, numel_stood_for
from shardtop.probe.shards.stale_optim import add_stale_optimizer_info
from shardtop.probe.shards.table import OFFLOADED, REPLICATED, SHARDED, ShardTable, dtype_name
from shardtop.probe.shards.tree import ModuleTree
from shardtop.rundir.events import Unit

WRAPPER_CLASS = "FullyShardedDataParallel"


def is_fsdp1_wrapper(module: Any) -> bool:
    return any(c.__name__ == WRAPPER_CLASS for c in type(module).__mro__)


def is_flat_param(param: Any) -> bool:
    return bool(getattr(param, "_is_flat_param", False))


@dataclass
class _Summary:
    """What the units have in common, for ``info``."""

    strategies: Counter[str] = field(default_factory=Counter)
    root_strategy: str = ""
    offload: bool = False
    use_orig_params: bool | None = None
    param_dtype: str = ""
    reduce_dtype: str = ""
    shard_group_size: int = 0
    replicate_group_size: int = 1


def read_fsdp1(tree: ModuleTree, table: ShardTable, optimizer: Any = None) -> None:
    """Fill ``table`` for a model with FSDP1 units (root wrapped or not)."""
    summary = _Summary()
    claimed: set[int] = set()
    splits: dict[int, Split] = {}
    flats: list[Any] = []
    for wrapper, row in tree.wrappers:
        if not is_fsdp1_wrapper(wrapper):
            continue
        handle = _handle_of(wrapper)
        flat = getattr(handle, "flat_param", None) if handle is not None else None
        strategy = _strategy(handle, flat) or _wrapper_strategy(wrapper)
        _note_wrapper(summary, wrapper, handle, row, strategy)
        unit = table.add_unit(_unit(row, flat, handle, strategy))
        if flat is not None and id(flat) not in claimed:
            _add_flat(tree, table, flat, handle, unit, claimed, splits)
            flats.append(flat)
    for index, param in enumerate(tree.params):
        if is_flat_param(param) and id(param) not in claimed:
            # The wrapper is outside ``target`` (e.g. a LightningModule inside FSDP): metadata only.
            unit = table.add_unit(_unit(tree.param_rows[index], param, None, _strategy(None, param)))
            _add_flat(tree, table, param, None, unit, claimed, splits)
            flats.append(param)
    rest = [i for i, p in enumerate(tree.params) if id(p) not in claimed]
    count, nbytes = add_plain(tree, table, rest)
    _add_grads(tree, table, flats, rest, splits)
    add_optimizer_state(tree, table, optimizer, splits)
    table.claimed.update(claimed)
    add_stale_optimizer_info(tree, table, optimizer)
    _fill_info(table, summary, count, nbytes)


def _handle_of(wrapper: Any) -> Any:
    handle = getattr(wrapper, "_handle", None)
    if handle is None:
        handles = getattr(wrapper, "_handles", None)  # torch < 2.1
        handle = handles[0] if handles else None
    return handle


def _strategy(handle: Any, flat: Any) -> str:
    """The handle's ``HandleShardingStrategy`` name; without a handle only NO_SHARD can be told."""
    strategy = getattr(handle, "_sharding_strategy", None)
    if strategy is not None:
        return str(getattr(strategy, "name", strategy))
    if flat is None:
        return ""
    return "NO_SHARD" if _local_numel(flat) >= sum(_numels(flat)) else ""


def _wrapper_strategy(wrapper: Any) -> str:
    """What the wrapper was asked for; a unit without parameters has no handle to ask."""
    try:
        strategy = wrapper.sharding_strategy
    except Exception:
        return ""
    return str(getattr(strategy, "name", strategy or ""))


def _offloads(handle: Any) -> bool:
    return bool(getattr(handle, "_offload_params", False))


def _numels(flat: Any) -> list[int]:
    numels = getattr(flat, "_numels", None)
    if numels is None:
        numels = [math.prod(shape) for shape in getattr(flat, "_shapes", ())]
    return list(numels)


def _local_numel(flat: Any) -> int:
    """Elements of this rank's shard, padding included."""
    size = getattr(flat, "_sharded_size", None)
    if size is not None:
        return math.prod(size)
    numel: int = _shard(flat).numel()
    return numel


def _unit(row: int, flat: Any, handle: Any, strategy: str) -> Unit:
    if flat is None:
        return Unit(module=row, kind="fsdp1", numel=0, local_numel=0, strategy=strategy, offload=_offloads(handle))
    local = _local_numels(flat)
    local_numel = _local_numel(flat)
    grad = getattr(flat, "grad", None)
    return Unit(
        module=row,
        kind="fsdp1",
        numel=sum(_numels(flat)),
        local_numel=local_numel,
        padding=max(0, local_numel - sum(local)),
        strategy=strategy,
        offload=_offloads(handle),
        dtype=dtype_name(_shard(flat).dtype),
        params=len(getattr(flat, "_param_infos", ())),
        frozen=_frozen_numel(flat),
        grad_numel=grad.numel() if grad is not None else None,
    )


def _frozen_numel(flat: Any) -> int:
    """Elements of the unit's originals that need no gradient.

    With ``use_orig_params=True`` FSDP1 keeps the originals (``_params``) and lets frozen and
    trainable ones share one FlatParameter, whose gradient then covers all of them; without it,
    a FlatParameter is frozen or trainable as a whole.
    """
    originals = getattr(flat, "_params", None)
    numels = _numels(flat)
    if originals and len(originals) == len(numels):
        return sum(n for p, n in zip(originals, numels, strict=True) if not p.requires_grad)
    return 0 if getattr(flat, "requires_grad", True) else sum(numels)


def _shard(flat: Any) -> Any:
    """The tensor holding this rank's shard at rest.

    Between forward and backward a FlatParameter may point at the gathered
    (possibly low-precision) full tensor; ``_local_shard`` (set at FSDP's lazy
    init) keeps the shard, its device (CPU when offloaded) and its dtype.
    """
    shard = getattr(flat, "_local_shard", None)
    return shard if shard is not None else flat


def _local_numels(flat: Any) -> list[int]:
    """Elements of each original parameter inside this rank's shard, padding excluded."""
    numels = _numels(flat)
    infos = getattr(flat, "_shard_param_infos", None)
    if infos is None:
        return numels
    return [(info.numel_in_shard or 0) if info.in_shard else 0 for info in infos]


def _state(handle: Any, flat: Any) -> str:
    if _offloads(handle):
        return OFFLOADED
    strategy = _strategy(handle, flat)
    return REPLICATED if strategy == "NO_SHARD" else SHARDED


def _add_flat(
    tree: ModuleTree,
    table: ShardTable,
    flat: Any,
    handle: Any,
    unit: int,
    claimed: set[int],
    splits: dict[int, Split],
) -> None:
    """One FlatParameter's originals, each at its module's row."""
    claimed.add(id(flat))
    for group in ("_params", "_shared_params"):
        for param in getattr(flat, group, None) or ():
            claimed.add(id(param))
    # Mid-forward with use_orig_params, FSDP registers plain views in the originals' places.
    for infos in ("_param_infos", "_shared_param_infos"):
        for info in getattr(flat, infos, ()):
            registered = info.module._parameters.get(info.param_name)
            if registered is not None:
                claimed.add(id(registered))
    shard = _shard(flat)
    device = table.device_id(shard.device)
    state = table.state_id(_state(handle, flat))
    itemsize = shard.element_size()
    split: Split = []
    # A FlatParameter without ``_param_infos`` (a torch that names it otherwise) places nothing.
    param_infos = getattr(flat, "_param_infos", ())
    for info, numel, local in zip(param_infos, _numels(flat), _local_numels(flat), strict=False):
        row = tree.row_of.get(id(info.module), -1)
        if row < 0:
            continue
        registered = info.module._parameters.get(info.param_name)
        elements = numel_stood_for(held_quant_state(registered, info.module, info.param_name), numel)
        table.add(row, numel, local, itemsize, device, state, unit, elements)
        split.append((row, local))
    splits[id(flat)] = split


def _add_grads(
    tree: ModuleTree, table: ShardTable, flats: list[Any], rest: list[int], splits: dict[int, Split]
) -> None:
    """Flat gradients split by shard.  With ``use_orig_params`` the originals carry views of it,
    but only the trainable ones: the flat gradient, frozen elements included, is what is allocated."""
    for flat in flats:
        originals = getattr(flat, "_params", None)
        if flat.grad is not None:
            add_split(table, splits.get(id(flat), []), flat.grad, table.add_grad)
        elif originals:
            add_grads(tree, table, [tree.param_index[id(p)] for p in originals if id(p) in tree.param_index], {})
    add_grads(tree, table, rest, splits)


def _note_wrapper(summary: _Summary, wrapper: Any, handle: Any, row: int, strategy: str) -> None:
    if strategy:
        summary.strategies[strategy] += 1
        if row == 0 and not summary.root_strategy:
            summary.root_strategy = strategy
    summary.offload = summary.offload or _offloads(handle) or bool(
        getattr(getattr(wrapper, "cpu_offload", None), "offload_params", False)
    )
    if handle is None:
        return
    if summary.use_orig_params is None:
        summary.use_orig_params = bool(getattr(handle, "_use_orig_params", False))
    if not summary.param_dtype:
        summary.param_dtype = dtype_name(getattr(handle, "_fwd_bwd_param_dtype", "") or "")
        summary.reduce_dtype = dtype_name(getattr(handle, "_reduce_dtype", "") or "")
    summary.shard_group_size = max(summary.shard_group_size, int(getattr(handle, "world_size", 0) or 0))
    inter = getattr(wrapper, "_inter_node_pg", None)
    if inter is not None:  # hybrid: the replicas of each shard
        summary.replicate_group_size = max(summary.replicate_group_size, inter.size())


def _fill_info(table: ShardTable, summary: _Summary, unmanaged: int, unmanaged_bytes: int) -> None:
    info = table.info
    strategies = summary.strategies
    info["sharding_strategy"] = summary.root_strategy or (strategies.most_common(1)[0][0] if strategies else "")
    if len(strategies) > 1:
        info["sharding_strategies"] = ",".join(sorted(strategies))
    info["fsdp_units"] = len(table.units)
    info["root_wrapped"] = any(unit.module == 0 for unit in table.units)
    info["unmanaged_params"] = unmanaged
    info["unmanaged_bytes"] = unmanaged_bytes
    info["offload"] = summary.offload
    if summary.use_orig_params is not None:
        info["use_orig_params"] = summary.use_orig_params
    if summary.param_dtype:
        info["param_dtype"] = summary.param_dtype
        info["reduce_dtype"] = summary.reduce_dtype
    if summary.shard_group_size:
        info["shard_group_size"] = summary.shard_group_size
        info["replicate_group_size"] = summary.replicate_group_size
        info["data_parallel_size"] = summary.shard_group_size * summary.replicate_group_size
