"""Optimizer tensors that are not the engine's parameters: an optimizer built before wrapping.

FSDP1 flattens the model's parameters into FlatParameters and FSDP2 replaces
them with DTensors; an optimizer made from ``model.parameters()`` before that
still holds the originals.  They are no longer the model's: the optimizer
steps tensors no forward uses (their gradients stay None), the engine's own
parameters are never updated, and the originals' full storage stays alive on
every rank.  DDP keeps the model's parameters, so there an optimizer built
before wrapping is fine and nothing is found.

Only tensors the size of one of the model's original parameters count (an
optimizer may also hold another model's parameters, which are not stale).
``info`` gets ``optimizer_params`` (every tensor the optimizer holds) and
``stale_optimizer_params``, ``_numel`` and ``_bytes`` (the storage they keep
alive, each storage once).
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from shardtop.probe.shards.optim import torch_optimizers
from shardtop.probe.shards.table import ShardTable
from shardtop.probe.shards.tree import ModuleTree


def add_stale_optimizer_info(tree: ModuleTree, table: ShardTable, optimizer: Any) -> None:
    """Count the optimizer's tensors that are none of the engine's parameters (see the module doc)."""
    optimizers = torch_optimizers(optimizer)
    if not optimizers:
        return
    own = {id(p) for p in tree.params} | table.claimed
    sizes = Counter(table.param_numels or {})
    held = stale = numel = nbytes = 0
    storages: set[int] = set()
    for opt in optimizers:
        for group in opt.param_groups:
            for tensor in group.get("params", ()):
                held += 1
                size = tensor.numel()
                if id(tensor) in own or sizes[size] <= 0:
                    continue
                sizes[size] -= 1
                stale += 1
                numel += size
                storage = tensor.untyped_storage()
                if storage.data_ptr() not in storages:
                    storages.add(storage.data_ptr())
                    nbytes += storage.nbytes()
    table.info["optimizer_params"] = held
    table.info["stale_optimizer_params"] = stale
    table.info["stale_optimizer_numel"] = numel
    table.info["stale_optimizer_bytes"] = nbytes
