"""Gradient and torch-optimizer-state bytes, mapped back to the modules that own them.

Counted: every tensor in ``optimizer.state[param]`` (a DTensor by its local
shard) and ``param.grad`` as stored on this rank.  An FSDP1 ``FlatParameter``
holds many modules' parameters, so its gradient and its state tensors are split
by the reader's ``Split`` (how many of the local elements belong to which
row); a state tensor of another size (Adam's scalar ``step``) goes to the
first of those rows.  DeepSpeed's ZeRO optimizers keep their own partitions and
are read by ``deepspeed.py`` instead.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from shardtop.probe.shards.table import ShardTable, local_tensor
from shardtop.probe.shards.tree import ModuleTree

Split = list[tuple[int, int]]
"""(row, local elements of that row) for each original parameter inside one flat tensor."""


def torch_optimizers(optimizer: Any) -> list[Any]:
    """The torch optimizers behind what the caller passed: one, a list, or Lightning's wrapper."""
    if optimizer is None:
        return []
    if isinstance(optimizer, (list, tuple)):
        return [o for item in optimizer for o in torch_optimizers(item)]
    inner = getattr(optimizer, "_optimizer", None)  # LightningOptimizer
    if inner is not None and hasattr(inner, "state"):
        optimizer = inner
    return [optimizer] if hasattr(optimizer, "state") and hasattr(optimizer, "param_groups") else []


def _nbytes(tensor: Any) -> int:
    local = local_tensor(tensor)
    nbytes: int = local.numel() * local.element_size()
    return nbytes


def add_split(table: ShardTable, split: Split, tensor: Any, add: Any) -> None:
    """Spread one flat tensor's bytes over the rows in ``split``.

    A tensor shaped like the shard (it may be longer by the shard's padding,
    which no row gets) is split element by element; a scalar such as Adam's
    ``step`` goes to the first row.
    """
    local = local_tensor(tensor)
    numel = local.numel()
    total = sum(part for _, part in split)
    itemsize = local.element_size()
    if numel >= total and (numel > 1 or total == 1):
        for row, part in split:
            add(row, part * itemsize)
    elif split:
        add(split[0][0], numel * itemsize)


def add_grads(tree: ModuleTree, table: ShardTable, indices: Iterable[int], splits: dict[int, Split]) -> None:
    """``param.grad`` of the parameters at ``indices``, flat ones split by ``splits``."""
    params = tree.params
    rows = tree.param_rows
    for index in indices:
        param = params[index]
        grad = param.grad
        if grad is None:
            continue
        split = splits.get(id(param))
        if split is not None:
            add_split(table, split, grad, table.add_grad)
        else:
            table.add_grad(rows[index], _nbytes(grad))


def add_optimizer_state(tree: ModuleTree, table: ShardTable, optimizer: Any, splits: dict[int, Split]) -> int:
    """Bytes of every state tensor of a torch optimizer, per owning row; returns the total."""
    optimizers = torch_optimizers(optimizer)
    if optimizers and table.optim_bytes is None:
        table.optim_bytes = [0] * len(tree)  # an optimizer without state yet holds 0 bytes
    total = 0
    for opt in optimizers:
        for param, state in opt.state.items():
            if not isinstance(state, dict):
                continue
            row = tree.row_of_param(param)
            split = splits.get(id(param))
            for value in state.values():
                if not hasattr(value, "element_size"):
                    continue
                nbytes = _nbytes(value)
                total += nbytes
                if split is not None:
                    add_split(table, split, value, table.add_optim)
                elif row >= 0:
                    table.add_optim(row, nbytes)
    return total
