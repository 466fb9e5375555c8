"""DistributedDataParallel: every managed parameter whole on every rank.

DDP is the baseline a sharded run is compared against: each rank holds the
full model, so a module's bytes summed over ranks are N times its size.  One
unit per DDP wrapper, rooted at the module it wraps; parameters DDP was told
to ignore (``_ddp_params_and_buffers_to_ignore``) are not kept in step and read
``unsharded``.
"""

from __future__ import annotations

from typing import Any

from shardtop.probe.shards.optim import add_grads, add_optimizer_state
from shardtop.probe.shards.placement import add_plain
from shardtop.probe.shards.quantized import logical_numel
from shardtop.probe.shards.stale_optim import add_stale_optimizer_info
from shardtop.probe.shards.table import REPLICATED, ShardTable, dtype_name
from shardtop.probe.shards.tree import ModuleTree
from shardtop.rundir.events import Unit

WRAPPER_CLASS = "DistributedDataParallel"


def is_ddp_wrapper(module: Any) -> bool:
    return any(c.__name__ == WRAPPER_CLASS for c in type(module).__mro__)


def read_ddp(tree: ModuleTree, table: ShardTable, optimizer: Any = None) -> None:
    """Fill ``table`` for one or more DDP wrappers in the tree."""
    claimed: set[int] = set()
    ends = tree.subtree_ends()
    first: Any = None
    for wrapper, row in tree.wrappers:
        if not is_ddp_wrapper(wrapper):
            continue
        first = first or wrapper
        managed = getattr(wrapper, "_module_parameters", None)
        managed_ids = {id(p) for p in managed} if managed is not None else None
        indices = [
            i
            for i, (param, param_row) in enumerate(zip(tree.params, tree.param_rows, strict=True))
            if row <= param_row < ends[row]
            and id(param) not in claimed
            and (managed_ids is None or id(param) in managed_ids)
        ]
        claimed.update(id(tree.params[i]) for i in indices)
        unit = table.add_unit(_unit(tree, row, indices))
        add_plain(tree, table, indices, REPLICATED, unit)
    rest = [i for i, p in enumerate(tree.params) if id(p) not in claimed]
    count, nbytes = add_plain(tree, table, rest)
    add_grads(tree, table, range(len(tree.params)), {})
    add_optimizer_state(tree, table, optimizer, {})
    add_stale_optimizer_info(tree, table, optimizer)
    _fill_info(table, first, count, nbytes)


def _unit(tree: ModuleTree, row: int, indices: list[int]) -> Unit:
    params = [tree.params[i] for i in indices]
    numel = sum(logical_numel(p, p.numel()) for p in params)
    return Unit(
        module=row,
        kind="ddp",
        numel=numel,
        local_numel=numel,
        strategy="replicate",
        dtype=dtype_name(params[0].dtype) if params else "",
        params=len(params),
    )


def _fill_info(table: ShardTable, wrapper: Any, unmanaged: int, nbytes: int) -> None:
    info = table.info
    info["ddp_units"] = len(table.units)
    info["unmanaged_params"] = unmanaged
    info["unmanaged_bytes"] = nbytes
    group = getattr(wrapper, "process_group", None)
    size = getattr(group, "size", None)
    if callable(size):
        info["data_parallel_size"] = int(size())
    for key in ("find_unused_parameters", "gradient_as_bucket_view", "static_graph", "broadcast_buffers"):
        value = getattr(wrapper, key, None)
        if isinstance(value, bool):
            info[key] = value
    cap = getattr(wrapper, "bucket_bytes_cap", None)
    if isinstance(cap, int):
        info["bucket_bytes_cap"] = cap
