"""Parameters no engine manages: a plain model, a model placed by hand, leftovers.

"Manual" placement is what story 1's user asks for (``module.to("cuda:1")``):
whole modules on different devices of one process.  The same accounting
serves the parameters an engine left out (FSDP1 layers outside every unit stay
whole, often on the CPU), so every other reader calls ``add_plain`` for what it
did not claim.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch

from shardtop.probe.shards.optim import add_grads, add_optimizer_state
from shardtop.probe.shards.quantized import logical_numel
from shardtop.probe.shards.table import META, UNSHARDED, ShardTable, local_tensor
from shardtop.probe.shards.tree import ModuleTree

_PLAIN = (torch.nn.Parameter, torch.Tensor)
"""Exact types whose storage is the tensor itself (subclasses may be DTensors)."""


def add_plain(
    tree: ModuleTree,
    table: ShardTable,
    indices: Iterable[int],
    state: str = UNSHARDED,
    unit: int = -1,
) -> tuple[int, int]:
    """Account the parameters at ``indices`` as stored whole here; returns (count, full bytes).

    A DTensor outside any FSDP unit (tensor parallel only) stores its local
    shard; a parameter on the meta device stores nothing.  A quantized weight
    counts the elements it stands for, its bytes those it stores (``quantized.py``).
    """
    params = tree.params
    rows = tree.param_rows
    add = table.add
    state_id = table.state_id(state)
    devices: dict[Any, tuple[int, int]] = {}  # device -> (device id, state id); device.type is slow
    count = 0
    total = 0
    for index in indices:
        param = params[index]
        local = param if type(param) in _PLAIN else local_tensor(param)
        device = local.device
        known = devices.get(device)
        if known is None:
            meta = device.type == "meta"
            known = devices[device] = (table.device_id(device), table.state_id(META) if meta else state_id)
        numel = param.numel()
        itemsize = param.element_size()
        stored = 0 if known[1] != state_id else numel if local is param else local.numel()
        add(rows[index], numel, stored, itemsize, known[0], known[1], unit, logical_numel(param, numel))
        count += 1
        total += numel * itemsize
    return count, total


def read_placement(tree: ModuleTree, table: ShardTable, optimizer: Any = None, building: bool = False) -> str:
    """Plain or manual: one process, no engine; ``manual`` when parameters span devices (a rank's stage of a
    model split by hand beside the rest on the meta device too).  ``building``: the model was caught while
    being materialised (an OOM): what is still on the meta device is not placed, only not allocated yet."""
    add_plain(tree, table, range(len(tree.params)))
    add_grads(tree, table, range(len(tree.params)), {})
    add_optimizer_state(tree, table, optimizer, {})
    devices = set(table.devices) - ({"meta"} if building else set())
    return "manual" if len(devices) > 1 else "plain"
