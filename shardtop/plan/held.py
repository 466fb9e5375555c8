"""What one engine holds on a rank's device, before ``memory`` adds up the phases.  Torch-free."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final, Literal, NamedTuple

from shardtop.plan.strategies import Strategy

MomentKind = Literal["start", "unit", "end"]
START: Final = "start"
UNIT: Final = "unit"
END: Final = "end"


class BackwardMoment(NamedTuple):
    """One moment of an engine's backward that goes unit by unit (FSDP2), in bytes (a tuple: a model of
    18 000 units has as many moments)."""

    what: MomentKind
    """The start of backward (every activation saved, no gradient yet), a unit's backward, or the end."""
    row: int
    """The activations saved in forward before this row (pre-order) are still held: before the unit then
    running, or before the first unit at the end."""
    held: int
    """What the engine holds then beside the rank's shards and optimizer state: parameters whole, gradients
    (whole and sharded), reduce-scatter buffers."""


@dataclass(frozen=True)
class Held:
    """One engine's holdings on one rank, in bytes."""

    params: int
    grads: int
    optimizer: int
    optimizer_before_step: int = 0
    """Optimizer memory that exists from set-up on (ZeRO's fp32 master copy)."""
    buffers: int = 0
    """The engine's buffers from set-up on (DDP's gradient buckets, ZeRO-3's reduce bucket)."""
    backward_buffers: int = 0
    """Buffers the engine makes for each backward pass and frees at its end (ZeRO-1/2's reduce buckets)."""
    host: int = 0
    gathered_forward: int = 0
    gathered_backward: int = 0
    first_gathered: int | None = None
    """Whole parameters held in the first step's forward and backward, where that step differs (ZeRO-3
    learns the order of the modules in it, and only from the second step on prefetches and keeps them)."""
    grads_persist: bool = False
    """Gradients live in a buffer the engine allocated once at set-up (ZeRO-3), not in ``param.grad``."""
    grads_freed_by_step: bool = False
    """The engine's step frees the gradients (DeepSpeed), whatever the loop does after it."""
    backward_transient: int = 0
    """What backward holds for a moment beside the rest: the whole gradients of the unit being reduced."""
    first_backward_transient: int | None = None
    """The same in the first step, where it differs."""
    step_temporary: int = 0
    setup: int = 0
    """What set-up needs from the device at its worst moment."""
    setup_requests: tuple[tuple[str, int], ...] = ()
    """Where the engine's own buffers decide set-up: its requests in order, named for the user, each with
    what set-up needs from the device once it is served."""
    params_rounding: int = 0
    """What the CUDA caching allocator counts beyond ``params``: segments it left whole for tensors of their
    own (FSDP1's flat shards, ``allocator.new_segment_block``)."""
    grads_rounding: int = 0
    """The same beyond ``grads``, from the first backward on (FSDP1's flat gradient shards)."""
    backward_moments: tuple[BackwardMoment, ...] = ()
    """Where set, the backward is planned as the largest of these moments (``fsdp2.py``) instead of from
    ``gathered_backward`` and ``backward_transient`` beside the larger of the activations and the gradients."""


def step_temporary(s: Strategy, local_numel: int, largest: int, gpu: bool) -> int:
    """fp32 bytes a torch optimizer step allocates: foreach (GPU default) over all, a loop (CPU) per tensor."""
    return int(s.optimizer.step_temporary * (local_numel if gpu else largest) * 4)
