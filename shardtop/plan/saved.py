"""What a training step saves for backward, in bytes at the precision a strategy computes in.

The description counts the elements each module's forward saved (``describe.py``); a strategy says
in which dtype they are held: fp32 models hold them in their own dtype, mixed precision in half
(FSDP's ``MixedPrecision`` without autocast: inside the units only).  Under autocast each op runs in
its own dtype, so the description's bytes of a forward traced so are taken where it has them
(``saved_autocast_upto``): LayerNorm's input, softmax's output and whatever the forward keeps in fp32
are saved at 4 bytes.  Torch-free.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from typing import NamedTuple

from shardtop.plan.description import ModelDescription
from shardtop.plan.strategies import Strategy


def saved_activations(desc: ModelDescription, strategy: Strategy, rows: tuple[int, ...] | None = None) -> int:
    """Saved activations at the strategy's precision; ``rows``: only those subtrees (manual placement)."""
    if rows is None:
        floats = desc.saved_float_upto[-1]
        other = desc.saved_other_upto[-1] + desc.input_bytes
    else:
        floats = sum(desc.subtree(desc.saved_float_upto, r) for r in rows)
        other = sum(desc.subtree(desc.saved_other_upto, r) for r in rows)
    if _traced_under_autocast(desc, strategy):
        autocast = desc.saved_autocast_upto
        return (autocast[-1] if rows is None else sum(desc.subtree(autocast, r) for r in rows)) + other
    in_units = sum(_in_units(desc, strategy).values()) if strategy.half_in_units_only else 0
    return _as_held(desc, strategy, floats, other, in_units)


def activations_before(desc: ModelDescription, strategy: Strategy, rows: Sequence[int]) -> list[int]:
    """For each of ``rows``: the saved activations of the rows before it in forward order (pre-order), at the
    strategy's precision, and the batch.  The root's own saved tensors are left out: its own code (the loss)
    runs after its children, so they are the first the backward frees."""
    own_float = desc.saved_float_upto[1] - desc.saved_float_upto[0]
    own_other = desc.saved_other_upto[1] - desc.saved_other_upto[0]
    ends: list[int] = []
    in_units_upto = [0]
    if strategy.half_in_units_only:
        for end, n in sorted((desc.end[u], n) for u, n in _in_units(desc, strategy).items() if u > 0):
            ends.append(end)
            in_units_upto.append(in_units_upto[-1] + n)
    floats_upto, other_upto = desc.saved_float_upto, desc.saved_other_upto
    if _traced_under_autocast(desc, strategy):
        autocast = desc.saved_autocast_upto
        own_bytes = autocast[1] - autocast[0]
        return [
            (max(0, autocast[row] - own_bytes) + max(0, other_upto[row] - own_other) if row > 0 else 0)
            + desc.input_bytes
            for row in rows
        ]
    return [
        _as_held(desc, strategy, max(0, floats_upto[row] - own_float) if row > 0 else 0,
                 (max(0, other_upto[row] - own_other) if row > 0 else 0) + desc.input_bytes,
                 in_units_upto[bisect.bisect_right(ends, row)] if ends else 0)
        for row in rows
    ]


def _traced_under_autocast(desc: ModelDescription, strategy: Strategy) -> bool:
    """The strategy runs autocast and the description has the bytes of a forward traced so."""
    return strategy.autocast and bool(desc.saved_autocast_upto)


def _in_units(desc: ModelDescription, strategy: Strategy) -> dict[int, int]:
    """Floating-point elements saved in each unit (the repeated blocks where the strategy names none)."""
    return desc.units(desc.saved_float_upto, strategy.units or tuple(desc.repeated_blocks))


def _as_held(desc: ModelDescription, strategy: Strategy, floats: int, other: int, in_units: int) -> int:
    """Bytes of ``floats`` saved elements (``in_units`` of them inside units) and ``other`` bytes."""
    if not strategy.half:
        return floats * desc.dtype_bytes + other
    if strategy.half_in_units_only:
        return in_units * 2 + (floats - in_units) * desc.dtype_bytes + other
    return floats * 2 + other


class Recompute(NamedTuple):
    """Activation checkpointing's backward, in bytes at the configured batch: the largest checkpointed region's
    activations, recomputed when the backward reaches it, and its transient; what the backward freed before
    reaching any region."""

    activations: int
    transient: int
    freed_before: int


def recomputed_region(desc: ModelDescription, strategy: Strategy, batch_scale: float) -> Recompute:
    """The regions run in the repeated blocks (half precision where the strategy computes in it); the head
    after them outside, like ``saved_activations``."""
    in_blocks = 2 if strategy.half else desc.dtype_bytes
    outside = 2 if strategy.half and not strategy.half_in_units_only else desc.dtype_bytes
    return Recompute(
        activations=int((desc.recomputed_float * in_blocks + desc.recomputed_other) * batch_scale),
        transient=int(desc.recomputed_output * in_blocks * batch_scale),
        freed_before=int((desc.after_checkpointed_float * outside + desc.after_checkpointed_other) * batch_scale),
    )


def largest_transient(desc: ModelDescription, strategy: Strategy) -> int:
    """The largest module output (and, in backward, its gradient) at compute precision."""
    return desc.largest_output * (2 if strategy.half and not strategy.half_in_units_only else desc.dtype_bytes)
