"""A ``ModelDescription`` from a model built on the meta device (torch side).

``describe_model`` walks the modules once (pre-order, like the probe's tree),
sums parameters per module, finds the repeated blocks an auto-wrap policy
would wrap, and counts one forward pass's saved activations
(``profile.py``).  Nothing is allocated: every tensor is on the meta device.

The plan's arithmetic knows one dtype (``dtype_bytes``: the trained
parameters'): a parameter stored in another (a bitsandbytes 4-bit weight packed
in ``uint8``, a frozen bf16 base beside fp32 adapters) counts the elements of
that dtype its storage fills, so that every sum of elements times
``dtype_bytes`` is the bytes the model holds.  The elements the parameters
stand for (a 4-bit weight's ``quant_state.shape``) are ``logical_params``, and
the tensors a 4-bit weight is dequantized with, ``quant_state_bytes``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import NamedTuple

import torch
from torch import nn

from shardtop.collector import collector_paused
from shardtop.plan.description import ModelDescription
from shardtop.probe.shards.quantized import numel_stood_for, quant_state_tensors
from shardtop.trace.profile import SavedCounts, module_signatures, saved_activations
from shardtop.units import ceil_div

ZERO3_PERSISTENCE_THRESHOLD = 100_000
"""DeepSpeed's ``stage3_param_persistence_threshold`` default: smaller parameters stay whole on every rank."""

CONTAINERS = (nn.Sequential, nn.ModuleList, nn.ModuleDict)


def describe_model(
    model: nn.Module,
    forward_loss: Callable[[nn.Module], torch.Tensor] | None,
    *,
    name: str,
    batch_size: int,
    input_bytes: int,
    autocast: bool = True,
) -> ModelDescription:
    """Everything a plan needs to know about ``model`` (built on the meta device).

    ``forward_loss`` None: no batch is known yet, and no activation is counted.  ``autocast``: the forward
    is traced a second time as under CUDA's autocast (``autocast.py``), for the plans that run it so; a
    forward that cannot be traced so leaves those plans to count every saved element at 2 bytes.
    """
    under_autocast: list[int] = []
    with collector_paused():
        modules, names, parents, end = walk(model)
        dtype_bytes = _dtype_bytes(modules)
        numel, small, packed, each, each_packed = _own_params(modules, dtype_bytes)
        if forward_loss is None:
            saved = SavedCounts([0] * len(modules), [0] * len(modules), 0)
        else:
            signatures = module_signatures(modules, parents, names)
            saved = saved_activations(model, modules, end, signatures, forward_loss)
            if autocast:
                under_autocast = _saved_under_autocast(model, modules, end, signatures, forward_loss)
    trainable = sum(_as_dtype(int(getattr(p, "ds_numel", 0) or p.numel()), p, dtype_bytes)
                    for p in _parameters(modules) if p.requires_grad)
    buffers = sum(b.numel() * b.element_size() for m in modules for b in m._buffers.values() if b is not None)
    return ModelDescription(
        name=name,
        names=names,
        parents=parents,
        end=end,
        types=[type(m).__name__ for m in modules],
        numel_upto=_running(numel),
        small_upto=_running(small),
        small_threshold=ZERO3_PERSISTENCE_THRESHOLD,
        largest_param=max(each, default=0),
        param_numels=tuple(each),
        packed_upto=_running(packed) if any(packed) else [],
        param_packed=tuple(each_packed) if any(packed) else (),
        dtype_bytes=dtype_bytes,
        buffer_bytes=buffers,
        logical_params=_logical_params(modules),
        quant_state_bytes=_quant_state_bytes(modules),
        repeated_blocks=repeated_blocks(modules, parents, end, numel),
        saved_float_upto=_running(saved.saved_float),
        saved_other_upto=_running(saved.saved_other),
        saved_autocast_upto=_running(under_autocast) if under_autocast else [],
        largest_output=saved.largest_output,
        convolutions=saved.convolutions,
        input_bytes=input_bytes,
        batch_size=batch_size,
        trainable=trainable,
        checkpointed=saved.checkpointed,
        recomputed_float=saved.largest_recomputed.floats,
        recomputed_other=saved.largest_recomputed.other,
        recomputed_output=saved.largest_recomputed.largest_output,
        after_checkpointed_float=saved.saved_after_regions.floats,
        after_checkpointed_other=saved.saved_after_regions.other,
    )


def _saved_under_autocast(
    model: nn.Module, modules: Sequence[nn.Module], end: Sequence[int], signatures: dict[int, int],
    forward_loss: Callable[[nn.Module], torch.Tensor],
) -> list[int]:
    """Per row, the bytes of the floating-point tensors one forward saves as under CUDA's autocast to fp16;
    empty where the forward cannot be traced so."""
    try:
        return saved_activations(model, modules, end, signatures, forward_loss, autocast=torch.float16).saved_float
    except Exception:  # noqa: BLE001 - a forward the casts break is planned at 2 bytes an element, as before
        return []


def walk(model: nn.Module) -> tuple[list[nn.Module], list[str], list[int], list[int]]:
    """Modules in pre-order (each once), their names, parents and subtree ends."""
    modules: list[nn.Module] = []
    names: list[str] = []
    parents: list[int] = []
    seen: set[int] = set()
    stack: list[tuple[nn.Module, str, int]] = [(model, "", -1)]
    while stack:
        module, name, parent = stack.pop()
        if id(module) in seen:
            continue
        seen.add(id(module))
        row = len(modules)
        modules.append(module)
        names.append(name)
        parents.append(parent)
        kids = [(child, child_name, row) for child_name, child in module._modules.items() if child is not None]
        stack.extend(reversed(kids))
    end = list(range(1, len(modules) + 1))
    for row in range(len(modules) - 1, 0, -1):
        p = parents[row]
        end[p] = max(end[p], end[row])
    return modules, names, parents, end


def _parameters(modules: Sequence[nn.Module]) -> Iterator[nn.Parameter]:
    """Every parameter once, in the order ``named_parameters`` gives them."""
    seen: set[int] = set()
    for m in modules:
        for p in m._parameters.values():
            if p is not None and id(p) not in seen:
                seen.add(id(p))
                yield p


def _dtype_bytes(modules: Sequence[nn.Module]) -> int:
    """Bytes per element of the trained parameters (the first that requires a gradient), else of the first
    floating-point one: what gradients and optimizer state are counted in, never a 4-bit weight's packing."""
    params = list(_parameters(modules))
    first = next((p for p in params if p.requires_grad), None)
    if first is None:
        first = next((p for p in params if p.is_floating_point()), None)
    return first.element_size() if first is not None else 4


def _as_dtype(numel: int, param: nn.Parameter, dtype_bytes: int) -> int:
    """Elements of ``dtype_bytes`` that ``numel`` elements of ``param``'s dtype fill (rounded up)."""
    size = param.element_size()
    return numel if size == dtype_bytes else ceil_div(numel * size, dtype_bytes)


def _logical_params(modules: Sequence[nn.Module]) -> int:
    """Elements the parameters stand for: a 4-bit weight's ``quant_state.shape`` (a stand-in on the meta
    device carries its weight's ``quant_state``), every other parameter its own."""
    return sum(numel_stood_for(getattr(p, "quant_state", None), p.numel()) for p in _parameters(modules))


def _quant_state_bytes(modules: Sequence[nn.Module]) -> int:
    """Bytes of the tensors the 4-bit weights' ``quant_state`` holds (each tensor once): whole on every rank
    under every engine, since none of them is a parameter."""
    tensors = {id(t): t for p in _parameters(modules) for t in quant_state_tensors(getattr(p, "quant_state", None))}
    return sum(t.numel() * t.element_size() for t in tensors.values())


class OwnParams(NamedTuple):
    """Per module (row): elements of its own parameters, those in small parameters, and those in packed 4-bit
    weights (a ``quant_state`` on the parameter); per parameter, in the order ``named_parameters`` gives them (a
    shared one once): its elements, and whether it is a packed 4-bit weight.  Elements of ``dtype_bytes``."""

    numel: list[int]
    small: list[int]
    packed: list[int]
    each: list[int]
    each_packed: list[bool]


def _own_params(modules: Sequence[nn.Module], dtype_bytes: int) -> OwnParams:
    seen: set[int] = set()
    own = OwnParams([0] * len(modules), [0] * len(modules), [0] * len(modules), [], [])
    for row, m in enumerate(modules):
        for p in m._parameters.values():
            if p is None or id(p) in seen:
                continue
            seen.add(id(p))
            n = _as_dtype(p.numel(), p, dtype_bytes)
            is_packed = getattr(p, "quant_state", None) is not None
            own.numel[row] += n
            if n < ZERO3_PERSISTENCE_THRESHOLD:
                own.small[row] += n
            if is_packed:
                own.packed[row] += n
            own.each.append(n)
            own.each_packed.append(is_packed)
    return own


def repeated_blocks(
    modules: Sequence[nn.Module], parents: Sequence[int], end: Sequence[int], numel: Sequence[int]
) -> list[int]:
    """The rows a type-based auto-wrap policy would wrap: the repeated block of the model.

    Of the module types (containers aside) with two or more instances that
    together hold at least half of the parameters, the one with the fewest
    (so the largest) instances; nested instances count once, at the outermost.
    """
    upto = _running(numel)
    total = upto[-1]
    by_type: dict[type, list[int]] = {}
    for row, m in enumerate(modules):
        if row > 0 and not isinstance(m, CONTAINERS):
            by_type.setdefault(type(m), []).append(row)
    best: list[int] = []
    for rows in by_type.values():
        outermost, covered_to = [], -1
        for r in rows:
            if r >= covered_to:
                outermost.append(r)
                covered_to = end[r]
        held = sum(upto[end[r]] - upto[r] for r in outermost)
        if len(outermost) >= 2 and total and held * 2 >= total and (not best or len(outermost) < len(best)):
            best = outermost
    return best


def _running(values: Sequence[int]) -> list[int]:
    out = [0] * (len(values) + 1)
    total = 0
    for i, v in enumerate(values):
        total += v
        out[i + 1] = total
    return out
