"""Quantized weights: a packed tensor that stands for a larger one, and the tensors it is dequantized with.

A bitsandbytes 4-bit weight (``Params4bit``, QLoRA's base weights) is a
parameter whose storage packs two 4-bit elements to a byte, so its own
element count is not the weight's.  Its ``quant_state`` keeps the weight's
logical ``shape`` and the tensors that dequantize it: the blocks' scales
(``absmax``), the code of the 4-bit values (``code``) and, with nested
quantization, the scales' ``offset`` and their own state (``state2``, the
same fields again).  They are read here by attribute alone (bitsandbytes is
never imported) and never changed.

An engine that puts another tensor in the weight's place (FSDP2's DTensor
shard, FSDP1's view into its flat parameter) drops the ``quant_state`` with
the parameter's class; bitsandbytes' layers (``Linear4bit``, ``Embedding4bit``)
keep it on the module too, for their ``weight``, and hand it back at each
forward: ``held_quant_state`` reads it there.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

import torch

QUANT_STATE_TENSORS = ("absmax", "code", "offset")
"""The tensors a ``quant_state`` holds; ``NESTED_STATE`` holds them again for the scales."""
NESTED_STATE = "state2"
MAX_NESTING = 2
"""bitsandbytes nests once (the scales quantized in 8 bits); a deeper chain is not followed."""

_PLAIN = (torch.nn.Parameter, torch.Tensor)
"""Exact types that carry no ``quant_state``: read without a look-up (most of a model's parameters)."""


def quant_state(param: Any) -> Any:
    """The parameter's ``quant_state``, or None (a plain parameter, or a 4-bit weight not quantized yet)."""
    if type(param) in _PLAIN:
        return None
    return getattr(param, "quant_state", None)


QUANTIZED_WEIGHT = "weight"
"""The parameter whose ``quant_state`` bitsandbytes' layers keep on the module."""


def module_quant_state(module: Any) -> Any:
    """The ``quant_state`` a bitsandbytes layer keeps on itself for its weight, or None (any other module)."""
    held = getattr(module, "__dict__", None)
    return held.get("quant_state") if held else None


def held_quant_state(param: Any, module: Any, name: str) -> Any:
    """The ``quant_state`` of ``module``'s parameter ``name`` (now ``param``): the parameter's own, else, for
    the weight of a bitsandbytes layer whose weight an engine replaced, the one the layer keeps."""
    state = quant_state(param)
    if state is None and name == QUANTIZED_WEIGHT:
        state = module_quant_state(module)
    return state


def is_quantized(param: Any) -> bool:
    """A parameter that may carry a ``quant_state`` (it has the attribute, set or not yet)."""
    return type(param) not in _PLAIN and hasattr(param, "quant_state")


def logical_numel(param: Any, stored: int) -> int:
    """Elements ``param`` stands for: its ``quant_state.shape``'s, else ``stored`` (its own count)."""
    if type(param) in _PLAIN:
        return stored
    return numel_stood_for(getattr(param, "quant_state", None), stored)


def numel_stood_for(state: Any, stored: int) -> int:
    """Elements a weight quantized with ``state`` stands for: ``state.shape``'s; ``stored`` where there is
    no state (None) or it keeps no shape."""
    shape = getattr(state, "shape", None)
    if isinstance(shape, tuple) and all(isinstance(size, int) and size >= 0 for size in shape):
        return math.prod(shape)
    return stored


def quant_state_tensors(state: Any, nesting: int = MAX_NESTING) -> Iterator[torch.Tensor]:
    """The tensors of a ``quant_state`` (None: none), its nested state's included."""
    if state is None:
        return
    for name in QUANT_STATE_TENSORS:
        value = getattr(state, name, None)
        if isinstance(value, torch.Tensor):
            yield value
    if nesting > 0:
        yield from quant_state_tensors(getattr(state, NESTED_STATE, None), nesting - 1)
