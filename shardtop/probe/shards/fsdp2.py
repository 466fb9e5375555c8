"""FSDP2 (``fully_shard``): DTensor parameters grouped per ``FSDPModule``.

Each ``fully_shard`` call makes one ``FSDPParamGroup`` (one unit here; torch
2.13 may keep several per module with per-parameter meshes).  Each
``FSDPParam`` knows its original size (``_orig_size``), this rank's unpadded
shard (``sharded_size``) and the padded one all-gather uses
(``padded_sharded_param_size``); the registered parameter is a DTensor whose
global shape is the full size and whose ``to_local()`` is the shard.

Whether anything is sharded depends on the mesh FSDP was given, not on the
world size: Lightning's default ``ModelParallelStrategy()`` on 2 CPU processes
puts both on the tensor-parallel axis, so the data-parallel mesh has size 1 and
every rank holds everything.  ``info`` records the data-parallel size and the
whole mesh so the diagnosis can say so.

A unit caught unsharded (between its forward and its backward, as a unit that
does not reshard after forward stays) reads ``gathered`` at its full size: that
is what the rank holds then.  Each unit also says whether it is a root (FSDP2
never reshards a root after forward; a layer whose forward runs before any
enclosing unit's becomes a root of its own), how many of its elements are
frozen, and how large its gradients are.

With the gradient sync off (``set_requires_gradient_sync(False)``: HF's
``gradient_accumulation_steps``, Lightning's ``accumulate_grad_batches`` and
torchtitan accumulate so) a backward leaves each gradient unsharded, whole on
every rank, on the unsharded parameter (or in ``unsharded_accumulated_grad``
under mixed precision) until the micro-step that syncs: those are counted at
their full size.
"""

from __future__ import annotations

import math
from collections import Counter
from typing import Any

from shardtop.probe.shards.optim import add_grads, add_optimizer_state
from shardtop.probe.shards.placement import add_plain
from shardtop.probe.shards.quantized import held_quant_state, numel_stood_for
from shardtop.probe.shards.stale_optim import add_stale_optimizer_info
from shardtop.probe.shards.table import (
    GATHERED,
    OFFLOADED,
    REPLICATED,
    SHARDED,
    UNSHARDED,
    ShardTable,
    dtype_name,
    local_tensor,
)
from shardtop.probe.shards.tree import ModuleTree
from shardtop.rundir.events import Unit

MODULE_CLASS = "FSDPModule"


def is_fsdp2_class(cls: type) -> bool:
    return any(c.__name__ == MODULE_CLASS for c in cls.__mro__)



def is_dtensor(param: Any) -> bool:
    return hasattr(param, "placements") and hasattr(param, "device_mesh")


def read_fsdp2(tree: ModuleTree, table: ShardTable, optimizer: Any = None) -> None:
    """Fill ``table`` for a model with ``fully_shard`` applied (and any DTensor parameters)."""
    claimed: set[int] = set()
    found, applied = _param_groups(tree)
    groups = [group for group, _ in found]
    for group, root in found:
        _add_group(tree, table, group, root, claimed)
    rest = [i for i, p in enumerate(tree.params) if id(p) not in claimed]
    plain = [i for i in rest if not is_dtensor(tree.params[i])]
    count, nbytes = add_plain(tree, table, plain, UNSHARDED)
    for index in rest:
        param = tree.params[index]
        if is_dtensor(param):  # tensor parallel without FSDP: sharded if the local part is smaller
            state = SHARDED if local_tensor(param).numel() < param.numel() else REPLICATED
            add_plain(tree, table, [index], state)
    add_grads(tree, table, range(len(tree.params)), {})
    add_optimizer_state(tree, table, optimizer, {})
    table.claimed.update(claimed)
    add_stale_optimizer_info(tree, table, optimizer)
    _fill_info(table, groups, count, nbytes)
    table.info["root_wrapped"] = 0 in applied
    _fill_mesh(table, groups[0] if groups else None)


def _fsdp_state(module: Any) -> Any:
    getter = getattr(module, "_get_fsdp_state", None)
    if getter is None:
        return None
    try:
        return getter()
    except Exception:  # not initialised, or a torch that changed the contract
        return None


def _param_groups(tree: ModuleTree) -> tuple[list[tuple[Any, bool | None]], set[int]]:
    """Every FSDPParamGroup under the tree, once, in row order, with whether its state is a root
    (None before the first forward decided it); and the rows ``fully_shard`` was applied to.

    A module wrapped before ``fully_shard`` (torchtitan wraps each block for activation checkpointing
    first) is a wrapper of the tree, at the row of the module it wraps.  A ``fully_shard`` whose
    parameters all belong to units below (torchtitan's on the root) makes a state without a group.
    """
    groups: list[tuple[Any, bool | None]] = []
    applied: set[int] = set()
    seen: set[int] = set()
    cache: dict[type, bool] = {}
    candidates = sorted([*((row, m) for row, m in enumerate(tree.modules)), *((row, w) for w, row in tree.wrappers)],
                        key=lambda pair: pair[0])
    for row, module in candidates:
        cls = type(module)
        known = cache.get(cls)
        if known is None:
            known = cache[cls] = is_fsdp2_class(cls)
        if not known:
            continue
        state = _fsdp_state(module)
        if state is None or id(state) in seen:
            continue
        seen.add(id(state))
        applied.add(row)
        many = getattr(state, "_fsdp_param_groups", None)
        if many is None:  # torch < 2.13: one group per state
            one = getattr(state, "_fsdp_param_group", None)
            many = [one] if one is not None else []
        root = getattr(state, "_is_root", None)
        groups.extend((g, root if isinstance(root, bool) else None) for g in many if g is not None)
    return groups, applied


def _strategy(group: Any) -> str:
    """FSDP1's names for what FSDP2 does, so one vocabulary describes both."""
    info = getattr(group, "mesh_info", None)
    reshard = getattr(group, "post_forward_mesh_info", None) is not None
    if getattr(info, "shard_mesh_dim", None) is None:
        return "NO_SHARD"
    if getattr(info, "replicate_mesh_dim", None) is not None:
        return "HYBRID_SHARD" if reshard else "_HYBRID_SHARD_ZERO2"
    return "FULL_SHARD" if reshard else "SHARD_GRAD_OP"


def _group_sizes(group: Any) -> tuple[int, int]:
    """(shard group size, replicate group size) of a param group's mesh."""
    info = getattr(group, "mesh_info", None)
    return int(getattr(info, "shard_mesh_size", 1) or 1), int(getattr(info, "replicate_mesh_size", 1) or 1)


def _offloads(group: Any) -> bool:
    policy = getattr(group, "offload_policy", None)
    return any(c.__name__ == "CPUOffloadPolicy" for c in type(policy).__mro__)


def _add_group(tree: ModuleTree, table: ShardTable, group: Any, root: bool | None, claimed: set[int]) -> None:
    fsdp_params = list(getattr(group, "fsdp_params", ()))
    modules = getattr(group, "modules", ()) or ()
    rows = list(dict.fromkeys(tree.row_of[id(m)] for m in modules if id(m) in tree.row_of))
    row0 = rows[0] if rows else 0
    shard_size, _ = _group_sizes(group)
    offload = _offloads(group)
    gathered = bool(getattr(group, "is_unsharded", False)) and not offload
    state = table.state_id(
        GATHERED if gathered else OFFLOADED if offload else SHARDED if shard_size > 1 else REPLICATED
    )
    numel = local_numel = padded = frozen = 0
    grad_numel: int | None = None
    dtype = ""
    unit = table.add_unit(Unit(module=row0, kind="fsdp2", numel=0, local_numel=0))
    for fsdp_param in fsdp_params:
        param = fsdp_param.sharded_param
        full = math.prod(getattr(fsdp_param, "_orig_size", None) or param.shape)  # a DTensor's shape is global
        local = math.prod(getattr(fsdp_param, "sharded_size", None) or local_tensor(param).shape)
        row = _row(tree, fsdp_param, claimed)
        stored = full if gathered else local
        table.add(row, full, stored, param.element_size(), table.device_id(local_tensor(param).device), state, unit,
                  _elements(fsdp_param, full))
        numel += full
        local_numel += local
        padded += math.prod(getattr(fsdp_param, "padded_sharded_param_size", None) or (local,))
        dtype = dtype or dtype_name(param.dtype)
        if not param.requires_grad:
            frozen += full
        if param.grad is not None:
            grad_numel = (grad_numel or 0) + local_tensor(param.grad).numel()
        for grad in _unsharded_grads(fsdp_param, tree):
            table.add_grad(row, grad.numel() * grad.element_size())
            grad_numel = (grad_numel or 0) + grad.numel()
    table.units[unit] = Unit(
        module=row0,
        kind="fsdp2",
        numel=numel,
        local_numel=padded,
        padding=max(0, padded - local_numel),
        strategy=_strategy(group),
        offload=offload,
        dtype=dtype,
        params=len(fsdp_params),
        frozen=frozen,
        grad_numel=grad_numel,
        root=root,
        also=rows[1:],
    )


def _elements(fsdp_param: Any, full: int) -> int:
    """Elements the original parameter stands for: a 4-bit weight's logical count (its shard is a DTensor
    without a ``quant_state``: the layer's is read, ``quantized.py``), else ``full``."""
    info = getattr(fsdp_param, "_module_info", None)
    state = held_quant_state(fsdp_param.sharded_param, getattr(info, "module", None), getattr(info, "param_name", ""))
    return numel_stood_for(state, full)


def _unsharded_grads(fsdp_param: Any, tree: ModuleTree) -> list[Any]:
    """Gradients a backward with the sync off left unsharded, where the reader of registered parameters
    does not see them (the module holds the sharded parameter again)."""
    found = []
    unsharded = getattr(fsdp_param, "_unsharded_param", None)
    grad = getattr(unsharded, "grad", None)
    if grad is not None and tree.row_of_param(unsharded) < 0:
        found.append(grad)
    accumulated = getattr(fsdp_param, "unsharded_accumulated_grad", None)
    if accumulated is not None:
        found.append(accumulated)
    return found


def _row(tree: ModuleTree, fsdp_param: Any, claimed: set[int]) -> int:
    """The row owning an FSDPParam; mid-forward the module holds the unsharded parameter instead."""
    param = fsdp_param.sharded_param
    claimed.add(id(param))
    info = getattr(fsdp_param, "_module_info", None)
    registered = getattr(getattr(info, "module", None), getattr(info, "param_name", ""), None)
    if registered is not None:
        claimed.add(id(registered))
    row = tree.row_of_param(param)
    if row < 0 and registered is not None:
        row = tree.row_of_param(registered)
    if row < 0 and info is not None:
        row = tree.row_of.get(id(info.module), 0)
    return max(row, 0)


def _fill_info(table: ShardTable, groups: list[Any], unmanaged: int, nbytes: int) -> None:
    info = table.info
    info["fsdp_units"] = len(table.units)
    info["unmanaged_params"] = unmanaged
    info["unmanaged_bytes"] = nbytes
    if not groups:
        return
    # The root group never reshards after forward (FSDP2 decides so at lazy init): the
    # most common strategy is the one the user asked for.
    strategies = Counter(_strategy(group) for group in groups)
    info["sharding_strategy"] = strategies.most_common(1)[0][0]
    if len(strategies) > 1:
        info["sharding_strategies"] = ",".join(sorted(strategies))
    shard, replicate = _group_sizes(groups[0])
    info["shard_group_size"] = shard
    info["replicate_group_size"] = replicate
    info["data_parallel_size"] = shard * replicate
    info["reshard_after_forward"] = any(getattr(g, "post_forward_mesh_info", None) is not None for g in groups)
    info["offload"] = any(_offloads(group) for group in groups)
    policy = getattr(groups[0], "mp_policy", None)
    for key in ("param_dtype", "reduce_dtype"):
        value = getattr(policy, key, None)
        if value is not None:
            info[key] = dtype_name(value)


def _fill_mesh(table: ShardTable, group: Any) -> None:
    """The data-parallel mesh FSDP uses and the whole mesh it was cut from."""
    mesh = getattr(getattr(group, "mesh_info", None), "mesh", None)
    if mesh is None:
        return
    table.info["dp_mesh_shape"] = "x".join(str(n) for n in mesh.shape)
    table.info["dp_mesh_dims"] = ",".join(mesh.mesh_dim_names or ())
    root = _root_mesh(mesh)
    table.info["mesh_shape"] = "x".join(str(n) for n in root.shape)
    table.info["mesh_dims"] = ",".join(root.mesh_dim_names or ())


def _root_mesh(mesh: Any) -> Any:
    getter = getattr(mesh, "_get_root_mesh", None)
    try:
        if getter is not None:
            return getter() or mesh
        from torch.distributed.device_mesh import _mesh_resources  # torch < 2.9

        return _mesh_resources.get_root_mesh(mesh) or mesh
    except Exception:
        return mesh
