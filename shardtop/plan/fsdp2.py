"""FSDP2's backward, one unit at a time: what ``fully_shard`` holds while each unit's gradients are made.

FSDP2 (torch 2.13's ``_fsdp_param_group.py`` and ``_fsdp_collectives.py``;
the allocator traces of torch 2.11 on an H200 show the same terms at their
peaks) runs the backward of its units in the reverse of their forward order.
For each unit:

- its parameters are made whole before its backward: on one rank copied from
  the shard, one parameter at a time; on more, all-gathered, and the next
  unit's all-gather is issued as this one starts, its output held beside;
- autograd makes the unit's whole gradients, at compute precision;
- when they are made, FSDP2 frees the whole parameters, drops the previous
  unit's reduce-scatter input, copies the whole gradients into a new
  reduce-scatter input (at the reduce dtype, the parameters' by default),
  frees them, and keeps the sharded result as the parameters' ``.grad``.  That
  input is kept until the next unit's reduction begins.

Units asked to keep their parameters whole after forward
(``reshard_after_forward=False``: the root by default, accelerate's last norm
and head, every unit under SHARD_GRAD_OP) hold them from forward until their
own backward ends.  The root's own parameters (those in no other unit) get
their gradients at the head's backward and keep them whole until the end of
backward, where the root reduces them last.

So at any moment FSDP2 holds: the units whole then, the sharded gradients of
the units already reduced, one unit's whole gradients and one reduce-scatter
input.  At the start of backward no gradient exists yet, but every
activation does; during a unit's backward, the activations saved before it
in forward.  ``memory.py`` adds those activations to each moment here.
Torch-free.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from shardtop.plan.description import ModelDescription
from shardtop.plan.held import END, START, UNIT, BackwardMoment
from shardtop.plan.strategies import Strategy
from shardtop.units import ceil_div


def fsdp2_units(desc: ModelDescription, strategy: Strategy) -> tuple[int, ...]:
    """The units' rows, in forward order (the tree's pre-order)."""
    return tuple(sorted(set(strategy.units or desc.repeated_blocks)))


def kept_whole(desc: ModelDescription, strategy: Strategy) -> frozenset[int]:
    """Units whose parameters stay whole from forward to their backward: every unit under SHARD_GRAD_OP,
    the root when it is the only unit, else those the script asked so."""
    units = fsdp2_units(desc, strategy)
    if strategy.sharding == "SHARD_GRAD_OP":
        return frozenset(units)
    return frozenset(r for r in units if r == 0 or r in strategy.kept_whole)


def gathered_in_forward(desc: ModelDescription, strategy: Strategy, gathered_bytes: int) -> int:
    """Bytes whole at one moment of forward: the root's, the units kept whole that ran so far, and the unit
    running; each element at ``gathered_bytes``, a packed 4-bit weight's as stored."""
    units = fsdp2_units(desc, strategy)
    whole = {row: e.bytes(gathered_bytes, desc.dtype_bytes) for row, e in desc.elements_in(units).items()}
    root = desc.elements_outside(units).bytes(gathered_bytes, desc.dtype_bytes) if strategy.root_wrapped else 0
    kept = kept_whole(desc, strategy)
    most = kept_so_far = 0
    for row in units:
        if row in kept:
            kept_so_far += whole[row]
        most = max(most, kept_so_far + (0 if row in kept else whole[row]))
    return root + most


@dataclass(frozen=True)
class Fsdp2Backward:
    """FSDP2's backward on one rank, in bytes."""

    moments: tuple[BackwardMoment, ...]
    """Its start, each unit's backward in turn, and the root's reduction at the end."""
    gathered: int
    """The most parameters whole at one moment."""
    unit_grads: int
    """The most one unit's reduction holds: its whole gradients and its reduce-scatter input."""


def fsdp2_backward(desc: ModelDescription, strategy: Strategy, shard_ranks: int) -> Fsdp2Backward:
    """The moments of FSDP2's backward on one rank, each with what FSDP2 holds then beside the rank's shards
    and optimizer state."""
    stored = desc.dtype_bytes
    compute = 2 if strategy.half else stored
    share = desc.trained_share
    units = fsdp2_units(desc, strategy)
    numel = desc.units(desc.numel_upto, units)
    outside = desc.outside(desc.numel_upto, units)
    root, unmanaged = (outside, 0) if strategy.root_wrapped else (0, outside)
    kept = kept_whole(desc, strategy)
    # whole, at compute precision; a packed 4-bit weight as stored
    whole_bytes = {row: e.bytes(compute, stored) for row, e in desc.elements_in(units).items()}
    root_whole = desc.elements_outside(units).bytes(compute, stored) if strategy.root_wrapped else 0

    def whole(row: int) -> int:
        return whole_bytes[row]

    def grads(n: int) -> int:
        """Whole gradients, at compute precision (frozen parameters get none)."""
        return int(n * share) * compute

    def reduce_input(n: int) -> int:
        """The reduce-scatter input: the whole gradients, padded to a multiple of the ranks."""
        return ceil_div(int(n * share), shard_ranks) * shard_ranks * compute

    def reduced(n: int) -> int:
        """The sharded result at the reduce dtype, and its copy in the parameters' dtype where they differ."""
        shard = ceil_div(int(n * share), shard_ranks)
        return shard * compute + (shard * stored if compute != stored else 0)

    def sharded_grads(n: int) -> int:
        return 0 if strategy.offload_params else ceil_div(int(n * share), shard_ranks) * stored

    backward_order = list(reversed(units))
    resharded = [r for r in backward_order if r not in kept]
    next_resharded = dict(zip(resharded, resharded[1:], strict=False))

    def prefetched(row: int) -> int:
        """The next resharded unit's all-gather output, issued as ``row``'s backward starts (more than one
        rank: on one, each unit is copied from its shard when its own backward starts)."""
        following = next_resharded.get(row) if shard_ranks > 1 else None
        return 0 if following is None else whole(following)

    @functools.cache
    def reduction(n: int) -> tuple[int, int, int, int]:
        """A unit of ``n`` elements: whole gradients, reduce-scatter input, what reducing it adds, and its
        sharded gradients."""
        return grads(n), reduce_input(n), max(grads(n), reduced(n)), sharded_grads(n)

    # the gradients of parameters in no unit (whole, outside FSDP) and of the root's own: whole until the end
    outside_grads = int(unmanaged * share) * stored + grads(root)
    kept_bytes = sum(whole(r) for r in kept)
    first = resharded[0] if resharded else None
    start = root_whole + kept_bytes + (whole(first) + prefetched(first) if first is not None else 0)
    moments = [BackwardMoment(START, desc.rows, start)]
    largest_reduction, most_whole = 0, start
    done = previous_input = 0
    for row in backward_order:
        whole_unit = whole(row)
        unit_grads, unit_input, reducing_adds, unit_sharded_grads = reduction(numel[row])
        if row in kept:
            kept_bytes -= whole_unit  # the units kept whole still to come in backward, beside this one
        beside = root_whole + kept_bytes + prefetched(row)
        # while its gradients are made, and while they are copied into its reduce-scatter input
        making = whole_unit + unit_grads + previous_input
        reducing = unit_input + reducing_adds
        moments.append(BackwardMoment(UNIT, row, outside_grads + done + beside + max(making, reducing)))
        largest_reduction = max(largest_reduction, unit_grads + unit_input)
        most_whole = max(most_whole, beside + whole_unit)
        done += unit_sharded_grads
        previous_input = unit_input
    root_reduction = max(root_whole + grads(root) + previous_input,
                         reduce_input(root) + max(grads(root), reduced(root)) if root else 0)
    end = done + int(unmanaged * share) * stored + root_reduction
    moments.append(BackwardMoment(END, units[0] if units else 1, end))
    return Fsdp2Backward(moments=tuple(moments), gathered=most_whole, unit_grads=largest_reduction)
