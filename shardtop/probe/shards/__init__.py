"""Shard readers: how this rank holds each of the user's modules, as ``Tree`` + ``Shards``.

``read_shards(target, tree_id=..., stage=...)`` walks the model once
(``tree.py``), hands the rows to the reader of the engine it finds, one module
per engine (``fsdp1.py``, ``fsdp2.py``, ``deepspeed.py`` with
``zero_optim.py``, ``ddp.py``, ``placement.py``), sums them per module in
``table.py`` (gradients and torch optimizer state in ``optim.py``), and
returns the two events.

``target`` may be a plain module, a LightningModule (its trainer's wrapped
model is read instead, when there is one), an FSDP1 wrapper, a model with
``fully_shard`` applied, a DDP wrapper, a DeepSpeed engine, a model built in
``deepspeed.zero.Init``, or Lightning's wrapper around any of them.  Wrapper
modules never become rows.

Tree rows count each module's own parameters at full size and original dtype;
``Shards.bytes`` what this rank stores of them, padding excluded, so summed
over the ranks a sharded module gives its full size and a replicated one N
times it.

States (``Shards.states``), a small fixed vocabulary:

- ``sharded``: split across ranks by the engine (FSDP1 FULL_SHARD,
  SHARD_GRAD_OP, HYBRID_SHARD; FSDP2 on a data-parallel mesh larger than 1;
  ZeRO-3 partitions); this rank stores its part.
- ``replicated``: whole here and on every rank of the group, kept in step by the
  engine (DDP, FSDP1 NO_SHARD, FSDP2 on a data-parallel mesh of size 1,
  ZeRO-1/2 parameters).
- ``unsharded``: whole here and managed by no engine (a plain or hand-placed
  model, or a module left out of every FSDP unit).
- ``offloaded``: held in host memory or NVMe by the engine's offload policy
  (FSDP1 ``CPUOffload``, FSDP2 ``CPUOffloadPolicy``, ZeRO-3 ``offload_param``);
  the unit says whether it is sharded too.
- ``persistent``: kept whole on every rank by an engine that shards the rest
  (ZeRO-3's ``stage3_param_persistence_threshold``), at full size: "sharded"
  means what a rank keeps once the engine is done.
- ``gathered``: whole at the moment of the snapshot, gathered by the engine
  for compute and released later (an FSDP2 unit between its forward and its
  backward, a ZeRO-3 parameter in use), at full size.
- ``meta``: on the meta device, nothing stored yet.

A module without parameters has device and state -1; its unit is the innermost
unit rooted at it or an ancestor (-1 outside every unit).

Engines (``Shards.engine``): fsdp1, fsdp2, zero1, zero2, zero3, ddp (DeepSpeed
without ZeRO reads ddp too), manual (parameters on several devices of one
process), plain.

``info`` keys, every engine: ``devices`` (comma-separated, sorted),
``world_size`` and ``rank`` (when torch.distributed is up).  Then per engine:

- fsdp1: ``sharding_strategy`` (the root unit's, else the most common),
  ``sharding_strategies`` (when units differ), ``fsdp_units``,
  ``root_wrapped``, ``unmanaged_params``/``unmanaged_bytes`` (parameters in
  no unit), ``offload``, ``use_orig_params``, ``param_dtype``/``reduce_dtype``
  (mixed precision), ``shard_group_size``, ``replicate_group_size``,
  ``data_parallel_size``.
- fsdp2: ``fsdp_units``, ``root_wrapped``, ``unmanaged_params``/``_bytes``,
  ``sharding_strategy`` (in FSDP1's words), ``shard_group_size``,
  ``replicate_group_size``, ``data_parallel_size``, ``reshard_after_forward``,
  ``offload``, ``param_dtype``/``reduce_dtype`` (when set), ``dp_mesh_shape``,
  ``dp_mesh_dims``, ``mesh_shape``/``mesh_dims`` (the whole device mesh).
- zero1/zero2/zero3: ``zero_stage``, ``offload_param``, ``offload_optimizer``
  (none, cpu, nvme), ``data_parallel_size``, ``param_dtype``, ``optimizer``,
  ``partition_count``; zero3 also ``persistence_threshold`` and
  ``model_persistence_threshold`` (as the engine read them),
  ``persistent_params``/``_numel``/``_bytes`` (kept whole on every rank; the bytes held beside the partitions),
  ``gathered_params``/``gathered_bytes`` (others whole at the snapshot),
  ``unmanaged_params``/``_bytes``, and ``zero_init`` for a model partitioned
  by ``deepspeed.zero.Init`` before any engine exists.
- ddp: ``ddp_units``, ``unmanaged_params``/``_bytes``, ``data_parallel_size``,
  ``find_unused_parameters``, ``gradient_as_bucket_view``, ``static_graph``,
  ``broadcast_buffers``, ``bucket_bytes_cap``.
- manual/plain: nothing more.

fsdp1, fsdp2 and ddp, given the optimizer, also record ``optimizer_params``
and ``stale_optimizer_params``/``_numel``/``_bytes``: the optimizer's tensors
that are not the engine's parameters (an optimizer built before wrapping, see
``stale_optim.py``).  FSDP units record ``frozen`` elements and the gradient
elements the rank holds (``grad_numel``); FSDP2 units whether they are a root.

``grad_bytes`` counts ``param.grad`` as stored on this rank (FSDP1: its flat
gradient, frozen elements included), and the engines' own gradient stores
(ZeRO partitions, see ``zero_optim.py``; None when no source holds any);
``optim_bytes`` the optimizer's state (see ``optim.py`` and ``deepspeed.py``
for what is counted; None without an optimizer); ``act_bytes`` what each
module's own forward saved for backward, as measured by ``activations.py``
and passed in by module object (None when not given).
``offloaded_grad_bytes`` and ``offloaded_optim_bytes`` are the part of those
the engine's offload policy holds in host memory, as the engine says: the
ZeRO optimizers' ``offload_optimizer``/``cpu_offload`` (``zero_optim.py``),
else where a row's parameters are held ``offloaded`` (FSDP's CPU offload:
their gradients and state stay with them); None where nothing is.

Never imports textual, nor deepspeed (its objects are read, not imported).
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import torch

from shardtop.collector import collector_paused
from shardtop.probe.shards.ddp import is_ddp_wrapper, read_ddp
from shardtop.probe.shards.deepspeed import find_engine, is_zero3_param, read_deepspeed
from shardtop.probe.shards.fsdp1 import is_flat_param, is_fsdp1_wrapper, read_fsdp1
from shardtop.probe.shards.fsdp2 import is_dtensor, is_fsdp2_class, read_fsdp2
from shardtop.probe.shards.placement import read_placement
from shardtop.probe.shards.table import STATES, ShardTable
from shardtop.probe.shards.tree import ModuleTree, walk
from shardtop.rundir.events import Shards, SnapshotStage, Tree

__all__ = ["STATES", "read_shards", "resolve_target"]


def read_shards(
    target: Any, *, tree_id: int, stage: SnapshotStage, optimizer: Any = None, activations: dict[int, int] | None = None
) -> tuple[Tree, Shards]:
    """The module tree of ``target`` and how this rank holds it now.

    ``activations`` maps ``id(module)`` to the bytes its own forward saved; a
    wrapper's entry goes to the row of the module it wraps.

    The cyclic garbage collector is paused meanwhile: the walk allocates a few
    small objects per module, and on a 100 000-module model the collections
    they trigger (each traversing the whole model) cost as much as the walk.
    """
    with collector_paused():
        tree = walk(resolve_target(target))
        table = ShardTable(tree)
        if optimizer is not None:
            table.param_numels = Counter()
        engine = _read(tree, table, optimizer, building=stage == "oom")
        if activations is not None:
            table.add_activations(activations)
        _add_process_info(table)
        return table.tree_event(tree_id), table.shards_event(tree_id, engine, stage)


def resolve_target(target: Any) -> Any:
    """A LightningModule stands for its trainer's wrapped model (FSDP, DDP, DeepSpeed engine).

    Read from the LightningModule itself, an FSDP1 root unit or the DeepSpeed
    engine around it would be missed.
    """
    trainer = getattr(target, "_trainer", None)
    model = getattr(getattr(trainer, "strategy", None), "model", None)
    if model is not None and model is not target and hasattr(model, "_modules"):
        return model
    return target


def _read(tree: ModuleTree, table: ShardTable, optimizer: Any, building: bool = False) -> str:
    """Pick the reader by what the walk found.

    Order matters only for mixtures: a DeepSpeed engine, then FSDP1 units or
    FlatParameters, FSDP2 modules or DTensors, ZeRO-3 parameters without an
    engine (``deepspeed.zero.Init``), DDP, and otherwise plain or manual.
    """
    engine = find_engine(tree)
    if engine is not None:
        return read_deepspeed(tree, table, engine, optimizer)
    wrappers = [w for w, _ in tree.wrappers]
    kinds = _ParamKinds(tree.params)
    if any(is_fsdp1_wrapper(w) for w in wrappers) or kinds.flat:
        read_fsdp1(tree, table, optimizer)
        return "fsdp1"
    if _any_fsdp2(tree) or kinds.dtensor:
        read_fsdp2(tree, table, optimizer)
        return "fsdp2"
    if kinds.zero3:
        return read_deepspeed(tree, table, None, optimizer)
    if any(is_ddp_wrapper(w) for w in wrappers):
        read_ddp(tree, table, optimizer)
        return "ddp"
    return read_placement(tree, table, optimizer, building)


class _ParamKinds:
    """Which engines' marks the parameters carry, in one pass.

    Looks into each parameter's ``__dict__`` (where FSDP1 and DeepSpeed set
    ``_is_flat_param`` and ``ds_id``) instead of ``getattr`` on the tensor,
    which is several times slower when the attribute is missing.
    """

    def __init__(self, params: list[Any]) -> None:
        self.flat = self.dtensor = self.zero3 = False
        plain = (torch.nn.Parameter, torch.Tensor)
        for param in params:
            if type(param) not in plain and is_dtensor(param):
                self.dtensor = True
            marks = param.__dict__
            if marks:
                self.flat = self.flat or is_flat_param(param)
                self.zero3 = self.zero3 or is_zero3_param(param)


def _any_fsdp2(tree: ModuleTree) -> bool:
    return any(is_fsdp2_class(cls) for cls in {type(m) for m in tree.modules})


def _add_process_info(table: ShardTable) -> None:
    table.info.setdefault("devices", ",".join(sorted(set(table.devices))))
    try:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            table.info["world_size"] = dist.get_world_size()
            table.info["rank"] = dist.get_rank()
    except (ImportError, RuntimeError):
        pass
