"""Where each engine keeps its tensors, by kind: what a memory census reads.

A census (``memory_kinds.py``) counts storages, not tensors: FSDP's original
parameters are views of a FlatParameter, ZeRO's parameters views of one flat
buffer, DDP's gradients may be views of its buckets.  So every place a tensor
of a kind can hide is listed here, and the census counts each storage once.

The engines' private attributes change between versions; every read is a
``getattr`` with a default, and a name that is absent costs nothing.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch

from shardtop.probe.shards.ddp import is_ddp_wrapper
from shardtop.probe.shards.deepspeed import is_engine
from shardtop.probe.shards.fsdp1 import is_fsdp1_wrapper
from shardtop.probe.shards.fsdp2 import is_fsdp2_class
from shardtop.probe.shards.optim import torch_optimizers
from shardtop.probe.shards.quantized import is_quantized
from shardtop.probe.shards.zero_optim import is_zero_optimizer

FLAT_PARAM_TENSORS = {
    "params": ("_local_shard", "_full_param_padded", "_mp_shard", "_full_prec_full_param_padded"),
    "grads": ("grad", "_saved_grad_shard", "_cpu_grad"),
}
"""FSDP1 ``FlatParameter`` attributes: the shard, the all-gathered (padded) whole, the low-precision shard."""

FSDP2_PARAM_TENSORS = {
    "params": ("_sharded_param_data", "sharded_param", "_unsharded_param", "all_gather_outputs",
               "_unsharded_inner_tensors", "_sharded_post_forward_param_data"),
    "grads": ("unsharded_accumulated_grad",),
}
"""FSDP2 ``FSDPParam`` attributes; the gradients of ``sharded_param`` and ``_unsharded_param`` are read too."""

FSDP2_GROUP_TENSORS = {
    "grads": ("_partial_reduce_output",),
    "comm": ("_all_gather_result", "_all_reduce_state", "reduce_scatter_states", "_reduce_scatter_state"),
}
"""FSDP2 ``FSDPParamGroup`` attributes: all-gather output, reduce-scatter and all-reduce inputs in flight."""

FSDP2_COMM_CONTEXT = ("all_gather_state", "reduce_scatter_state", "reduce_scatter_states")

ZERO_TENSORS = {
    "params": ("bit16_groups_flat", "fp16_partitioned_groups_flat", "lp_param_buffer", "bf16_groups_flat",
               "fp16_groups_flat"),
    "grads": ("grad_partitions_flat_buffer", "_DeepSpeedZeroOptimizer_Stage3__param_id_to_grad_partition",
              "grads_in_partition", "averaged_gradients", "fp32_groups_gradients_flat", "fp32_groups_gradients",
              "fp32_groups_gradient_flat_partition"),
    "optimizer": ("single_partition_of_fp32_groups", "fp32_partitioned_groups_flat", "fp32_groups_flat_partition"),
    "comm": ("ipg_buckets", "ipg_buffer", "_DeepSpeedZeroOptimizer_Stage3__ipg_bucket_flat_buffer"),
}
"""ZeRO optimizers (stage 1/2, stage 3, ``BF16_Optimizer``): flat parameters, gradient partitions and
buffers, fp32 master partitions (whose ``.grad`` is a gradient too), reduce buckets."""

MASTER_PARTITIONS = ("single_partition_of_fp32_groups", "fp32_partitioned_groups_flat", "fp32_groups_flat_partition")


def tensors_in(value: Any, depth: int = 3) -> Iterator[torch.Tensor]:
    """Every tensor in a value: a tensor, a list/tuple/dict of them, a bucket object's ``buffer``."""
    if isinstance(value, torch.Tensor):
        yield value
    elif depth <= 0 or value is None:
        return
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from tensors_in(item, depth - 1)
    elif isinstance(value, dict):
        for item in list(value.values()):
            yield from tensors_in(item, depth - 1)
    else:
        buffer = getattr(value, "buffer", None)  # DeepSpeed's IPGBucket
        if buffer is not None:
            yield from tensors_in(buffer, depth - 1)
        output = getattr(value, "all_gather_output", None)  # FSDP2's AllGatherResult
        if output is not None:
            yield output


@dataclass
class EngineHolders:
    """What a census reads, gathered once per model (the parameters' list does not change per step)."""

    params: list[Any] = field(default_factory=list)
    """Every registered parameter (wrappers' too: an FSDP1 FlatParameter is registered on its wrapper)."""
    zero3: list[Any] = field(default_factory=list)
    """ZeRO-3 parameters: their ``ds_tensor`` partitions."""
    quantized: list[Any] = field(default_factory=list)
    """Parameters that carry a ``quant_state`` (bitsandbytes' 4-bit weights): its tensors are the parameter's
    too, read at each census (the weight gets a new one when it moves)."""
    quantized_layers: list[Any] = field(default_factory=list)
    """Modules that keep their weight's ``quant_state`` on themselves (bitsandbytes' layers): read too, for a
    weight an engine replaced by a tensor without one (FSDP2's DTensor shard)."""
    buffers: list[Any] = field(default_factory=list)
    flat_params: list[Any] = field(default_factory=list)
    fsdp2_params: list[Any] = field(default_factory=list)
    fsdp2_groups: list[Any] = field(default_factory=list)
    ddp: list[Any] = field(default_factory=list)
    zero_optimizers: list[Any] = field(default_factory=list)
    optimizers: list[Any] = field(default_factory=list)
    """Torch optimizers (a ZeRO optimizer's inner one included)."""

    def with_optimizers(self, objects: list[Any]) -> EngineHolders:
        """These holders plus the ZeRO optimizers among ``objects`` (or held by an engine among them)."""
        found = [getattr(o, "optimizer", None) if is_engine(o) else o for o in objects]
        extra = [o for o in found if is_zero_optimizer(o) and all(o is not z for z in self.zero_optimizers)]
        return dataclasses.replace(self, zero_optimizers=[*self.zero_optimizers, *extra]) if extra else self

    @property
    def engine(self) -> bool:
        """An engine is read, so its buffers were looked for: comm is measured (0 when none)."""
        return bool(self.flat_params or self.fsdp2_groups or self.ddp or self.zero_optimizers or self.zero3)


def gather_holders(root: Any, optimizer: Any = None) -> EngineHolders:
    """Walk ``root`` (a module, a wrapper or an engine; None: nothing) once and list what a census reads."""
    holders = EngineHolders()
    seen_params: set[int] = set()
    seen_states: set[int] = set()
    zero: list[Any] = []
    for module in _modules(root) if root is not None else ():
        for param in list(module._parameters.values()):
            if param is not None and id(param) not in seen_params:
                seen_params.add(id(param))
                holders.params.append(param)
                if hasattr(param, "ds_tensor"):
                    holders.zero3.append(param)
                if is_quantized(param):
                    holders.quantized.append(param)
                if getattr(param, "_is_flat_param", False):
                    holders.flat_params.append(param)
        holders.buffers.extend(b for b in list(module._buffers.values()) if b is not None)
        if "quant_state" in getattr(module, "__dict__", ()):
            holders.quantized_layers.append(module)
        cls = type(module)
        if is_fsdp2_class(cls):
            _add_fsdp2(holders, module, seen_states)
        elif is_ddp_wrapper(module):
            holders.ddp.append(module)
        elif is_engine(module):
            zero.append(getattr(module, "optimizer", None))
        elif is_fsdp1_wrapper(module):
            flat = getattr(getattr(module, "_handle", None), "flat_param", None)
            if flat is not None and id(flat) not in seen_params:
                seen_params.add(id(flat))
                holders.flat_params.append(flat)
    zero.append(getattr(optimizer, "_optimizer", optimizer))  # Lightning wraps the engine's optimizer
    for candidate in zero:
        if is_zero_optimizer(candidate) and all(candidate is not z for z in holders.zero_optimizers):
            holders.zero_optimizers.append(candidate)
    inner = [getattr(z, "optimizer", None) for z in holders.zero_optimizers]
    for opt in torch_optimizers([optimizer, *inner]):
        if all(opt is not known for known in holders.optimizers) and not is_zero_optimizer(opt):
            holders.optimizers.append(opt)
    return holders


def _modules(root: Any) -> Iterator[Any]:
    """Every module under ``root`` once, wrappers included (iteratively: chains may be deep)."""
    seen: set[int] = set()
    stack = [root]
    while stack:
        module = stack.pop()
        if id(module) in seen or not hasattr(module, "_modules"):
            continue
        seen.add(id(module))
        yield module
        stack.extend(child for child in list(module._modules.values()) if child is not None)


def _add_fsdp2(holders: EngineHolders, module: Any, seen: set[int]) -> None:
    getter = getattr(module, "_get_fsdp_state", None)
    try:
        state = getter() if getter is not None else None
    except Exception:  # noqa: BLE001 - not initialised yet
        return
    if state is None or id(state) in seen:
        return
    seen.add(id(state))
    groups = getattr(state, "_fsdp_param_groups", None)
    if groups is None:
        group = getattr(state, "_fsdp_param_group", None)
        groups = [group] if group is not None else []
    for group in groups:
        if group is None:
            continue
        holders.fsdp2_groups.append(group)
        holders.fsdp2_params.extend(getattr(group, "fsdp_params", ()) or ())
