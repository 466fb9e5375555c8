"""Bytes per rank for a strategy: one model of memory for every model.

For each engine the same few facts decide everything: how many of the
parameters a rank stores and in which dtype, the same for gradients and for
the optimizer's state (fp32 master copies included), which whole copies the
engine gathers for a moment, which buffers it allocates for itself, and how
the model reached the device.  A training step then peaks in one of four
phases:

- set-up: building the model and handing it to the engine, which makes its
  own buffers there (ZeRO: its fp32 master copy, gradient buffers and
  reduce bucket); counted as the allocator must hold it (``allocator``), since
  a buffer freed during set-up and cut for a smaller one stays reserved;
- forward: what persists, plus the units gathered now, plus the activations
  saved so far (and last step's gradients, when the loop keeps them);
- backward: activations are freed as gradients arrive, so it is the larger of
  the two, plus the gradients of the unit being reduced (and the buffers an
  engine makes for backward alone); a convolution's cuDNN workspace comes
  with the gradients, since the stem convolutions' backward runs last.
  FSDP2's backward is followed unit by unit instead (``fsdp2``): the largest
  of its moments, each with the activations still saved then;
- optimizer step: gradients, state (created at the first step) and the step's
  own temporaries.

A bitsandbytes 4-bit weight is held as it is stored under every strategy: no
precision casts it (a mixed-precision engine gathers it packed, autocast keeps
no copy of it), no engine gives it a gradient or optimizer state, and only an
engine that splits every parameter (FSDP, ZeRO-3) splits it; the tensors it is
dequantized with (``quant_state``) are whole on every rank.

The first forward and backward come before the optimizer has any state (a
torch optimizer creates it at the first step; ZeRO has only what its set-up
made by then: the fp32 master copy, and for ZeRO-3 the reduce bucket and the
gradient partitions), so a run can pass them and fail at the first step:
``timeline`` keeps the phases in the order a run meets them, for "where does
it run out".  DeepSpeed ZeRO is in ``zero``.

The numbers come from the engines' code (torch 2.4-2.14, DeepSpeed 0.15-0.19,
Lightning 2.4-2.6); none is fitted to a measurement.  On a GPU, FSDP1's flat
shards and their gradients are counted as PyTorch's caching allocator counts
them (``allocator.new_segment_block``), beside the parts (``PerRank.rounding``).  cuDNN's convolution
workspaces are the exception: no code decides them before the GPU does, so
they are measured (``workspaces.py``).  Torch-free.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import NamedTuple

import msgspec

from shardtop.plan.allocator import beyond_tensors
from shardtop.plan.description import Convolution, ModelDescription
from shardtop.plan.fsdp2 import fsdp2_backward, gathered_in_forward
from shardtop.plan.held import START, UNIT, BackwardMoment, Held, step_temporary
from shardtop.plan.saved import activations_before, largest_transient, recomputed_region, saved_activations
from shardtop.plan.strategies import SINGLE, Strategy
from shardtop.plan.workspaces import conv_workspace, on_rows, run_within
from shardtop.plan.zero import zero_held
from shardtop.rundir.engines import DDP, FSDP1, FSDP2, MANUAL, ZERO1, ZERO2, ZERO3
from shardtop.units import ceil_div

CUDA_WORKSPACES = 2 * 32 * 2**20
"""cuBLAS workspaces, allocated through PyTorch's allocator: one for the forward thread and one
for autograd's backward thread, 32 MiB each (PyTorch's default on Hopper and newer; 8 MiB before)."""

PHASES = ("set-up", "forward", "backward", "optimizer step")


class Phases(NamedTuple):
    """A rank's peak in each phase of a training step, in bytes (forward and backward: from the second step
    on, once the optimizer has its state); ``PHASES`` names them."""

    setup: int
    forward: int
    backward: int
    step: int


class Timeline(NamedTuple):
    """A rank's peaks in the order a run meets them, in bytes (``events.TIMELINE`` names them)."""

    setup: int
    first_forward: int
    first_backward: int
    first_step: int
    next_forward: int
    next_backward: int


@dataclass(frozen=True)
class PerRank:
    """What one rank holds on its device, in bytes."""

    params: int
    grads: int
    optimizer: int
    """Optimizer state, fp32 master copies included."""
    activations: int
    """Saved for backward at the end of forward, at the configured batch."""
    gathered: int
    """Largest whole (unsharded) parameters held at one moment of forward or backward."""
    buffers: int
    """The engine's own buffers at their most: DDP gradient buckets, ZeRO reduce buckets."""
    host: int
    """Moved to CPU memory by an offload policy (not counted in the peak)."""
    step_temporary: int
    """What the optimizer step allocates for itself (copies of gradients, intermediate results)."""
    unit_grads: int
    """Whole gradients of the unit being reduced in backward, before they are sharded or offloaded."""
    phases: Phases
    timeline: Timeline
    setup_requests: tuple[tuple[str, int], ...] = ()
    """Where the engine's own buffers decide set-up: its requests in order, named for the user, each with
    what set-up needs from the device once it is served."""
    conv_workspace: int = 0
    """cuDNN's largest measured convolution workspace, held in backward (``workspaces.py``)."""
    recomputed: int = 0
    """Activation checkpointing: the largest checkpointed region's activations, recomputed and held in backward
    (0 where nothing is checkpointed)."""
    rounding: int = 0
    """What the CUDA caching allocator counts beyond the parameters and gradients, once both exist: segments
    it left whole for tensors of their own (FSDP1's flat shards); in the phases, not in ``params``/``grads``."""

    @property
    def peak(self) -> int:
        return max(self.phases)

    @property
    def peak_phase(self) -> str:
        return PHASES[self.phases.index(self.peak)]

    @property
    def setup(self) -> int:
        return self.phases.setup

    def setup_request(self, usable: int | None = None) -> tuple[str, int] | None:
        """The request of set-up at which it first needs more than ``usable``, else the one at its peak;
        None where the engine's buffers do not decide set-up."""
        requests = self.setup_requests
        over = next(((what, needs) for what, needs in requests if usable is not None and needs > usable), None)
        return over or next(((what, needs) for what, needs in requests if needs == self.setup), None)


def per_rank(
    desc: ModelDescription, strategy: Strategy, devices: int, *, gpu: bool, batch_scale: float = 1.0
) -> PerRank:
    """Bytes on one rank's device when ``desc`` runs under ``strategy`` on ``devices`` ranks.

    ``batch_scale`` plans another batch size: activations scale with it.
    """
    if strategy.engine == MANUAL:
        return _manual(desc, strategy, gpu=gpu, batch_scale=batch_scale)
    held = _ENGINES[strategy.engine](desc, strategy, max(1, devices), gpu)
    if desc.quant_state_bytes:
        held = _with_quant_state(held, desc.quant_state_bytes)
    activations = int(saved_activations(desc, strategy) * batch_scale)
    return _phases(desc, strategy, held, activations, gpu=gpu, batch_scale=batch_scale)


def _with_quant_state(held: Held, quant_state: int) -> Held:
    """``held`` and the 4-bit weights' ``quant_state`` tensors, whole on the rank from set-up on: no engine
    shards or frees them, since they are no parameter."""
    return replace(held, params=held.params + quant_state, setup=held.setup + quant_state,
                   setup_requests=tuple((what, needs + quant_state) for what, needs in held.setup_requests))


def convolutions_as_run(desc: ModelDescription, strategy: Strategy, rows: tuple[int, ...] | None = None
                        ) -> tuple[Convolution, ...]:
    """The model's convolutions (those in ``rows``' subtrees) in the dtype they run in under ``strategy``."""
    convs = on_rows(desc, rows)
    if not strategy.half:
        return convs
    units = tuple(strategy.units or desc.repeated_blocks)

    def half(c: Convolution) -> bool:
        return not strategy.half_in_units_only or run_within(desc, c, units)

    return tuple(msgspec.structs.replace(c, dtype_bytes=2) if half(c) else c for c in convs)


def _conv_workspace(desc: ModelDescription, strategy: Strategy, rows: tuple[int, ...] | None, *, gpu: bool,
                    batch_scale: float) -> int:
    return conv_workspace(convolutions_as_run(desc, strategy, rows), batch_scale=batch_scale).bytes if gpu else 0


def _phases(
    desc: ModelDescription, strategy: Strategy, held: Held, activations: int, *, gpu: bool, batch_scale: float = 1.0,
    rows: tuple[int, ...] | None = None,
) -> PerRank:
    """``rows``: the subtrees on this device (manual placement), else the whole model."""
    workspace = CUDA_WORKSPACES if gpu else 0
    conv = _conv_workspace(desc, strategy, rows, gpu=gpu, batch_scale=batch_scale)
    transient = int(largest_transient(desc, strategy) * batch_scale)
    recompute = recomputed_region(desc, strategy, batch_scale) if rows is None and desc.checkpointed else None
    params = held.params + held.params_rounding  # as the allocator counts them
    grads = held.grads + held.grads_rounding
    persistent_grads = grads if held.grads_persist else 0
    first = params + held.optimizer_before_step + held.buffers + workspace + persistent_grads
    base = params + held.optimizer + held.buffers + workspace + persistent_grads
    kept = strategy.grads_kept_through_forward and not (held.grads_persist or held.grads_freed_by_step)
    grads_forward = grads if kept else 0
    # autocast's cached half-precision copies of the parameters (a packed 4-bit weight is dequantized, never cast)
    autocast_copies = desc.elements.plain * 2 if strategy.half and strategy.engine in (SINGLE, DDP) else 0
    growing = 0 if held.grads_persist else grads
    first_forward, first_backward = (
        (held.gathered_forward, held.gathered_backward) if held.first_gathered is None
        else (held.first_gathered, held.first_gathered))
    first_transient = (
        held.backward_transient if held.first_backward_transient is None else held.first_backward_transient)

    def forward(gathered: int) -> int:
        return gathered + autocast_copies + activations + transient

    def backward(gathered: int, reduced: int) -> int:
        # A stem convolution's backward comes last, when the activations are freed and the gradients made:
        # its workspace is held then, not beside the activations at the start of backward.
        held_most = max(activations, growing + conv) + 2 * transient
        if recompute is not None:
            # A checkpointed region is recomputed when the backward reaches it, the head's activations freed:
            # its activations and their gradients are held beside the inputs kept for the regions before it
            # (all but one at the last region) or the gradients made so far (nearly all at the first).
            in_region = recompute.activations + 2 * recompute.transient
            held_most = max(held_most, max(activations - recompute.freed_before, growing) + in_region)
        return gathered + held_most + reduced + held.backward_buffers

    saved_before = dict(zip(
        (m.row for m in held.backward_moments),
        activations_before(desc, strategy, [m.row for m in held.backward_moments]), strict=True))

    def at(moment: BackwardMoment) -> int:
        """A moment of a backward that goes unit by unit: the engine's holdings beside the activations still
        saved then, the largest output and its gradient, a checkpointed region recomputed in a unit, and the
        stem convolutions' workspace at the end."""
        if moment.what == START:
            return moment.held + activations + 2 * transient
        saved = int(saved_before[moment.row] * batch_scale)
        if moment.what == UNIT:
            in_region = recompute.activations + 2 * recompute.transient if recompute is not None else 0
            return moment.held + saved + 2 * transient + in_region
        return moment.held + saved + conv

    unit_by_unit = max(map(at, held.backward_moments), default=0) + held.backward_buffers
    first_backward_peak = first + unit_by_unit if held.backward_moments else first + backward(
        first_backward, first_transient)
    next_backward_peak = base + unit_by_unit if held.backward_moments else base + backward(
        held.gathered_backward, held.backward_transient)
    step = base + (0 if held.grads_persist else grads) + held.step_temporary
    timeline = Timeline(
        setup=held.setup,
        first_forward=first + forward(first_forward),
        first_backward=first_backward_peak,
        first_step=step,
        next_forward=base + grads_forward + forward(held.gathered_forward),
        next_backward=next_backward_peak,
    )
    return PerRank(
        params=held.params,
        grads=held.grads,
        optimizer=held.optimizer,
        activations=activations,
        gathered=max(held.gathered_forward, held.gathered_backward, held.first_gathered or 0),
        buffers=held.buffers + held.backward_buffers,
        host=held.host,
        step_temporary=held.step_temporary,
        unit_grads=held.backward_transient,
        phases=Phases(held.setup, timeline.next_forward, timeline.next_backward, step),
        timeline=timeline,
        setup_requests=held.setup_requests,
        conv_workspace=conv,
        recomputed=recompute.activations if recompute is not None else 0,
        rounding=held.params_rounding + held.grads_rounding,
    )


def state_bytes(desc: ModelDescription, strategy: Strategy) -> int:
    """A torch optimizer's state per element: in the parameters' dtype (``zeros_like``), so half of its
    fp32 size for a model kept in bf16 (Lightning's ``bf16-true``)."""
    return strategy.optimizer.state_bytes * desc.dtype_bytes // 4


def _single(desc: ModelDescription, strategy: Strategy, ranks: int, gpu: bool) -> Held:
    model_bytes, trained = desc.params * desc.dtype_bytes, desc.trained
    return Held(
        params=model_bytes,
        grads=trained * desc.dtype_bytes,
        optimizer=trained * state_bytes(desc, strategy),
        step_temporary=step_temporary(strategy, trained, desc.largest_param, gpu),
        setup=model_bytes,
    )


def _ddp(desc: ModelDescription, strategy: Strategy, ranks: int, gpu: bool) -> Held:
    """Whole everywhere, plus gradient buckets as large as the gradients (``gradient_as_bucket_view=False``)."""
    one = _single(desc, strategy, ranks, gpu)
    return replace(one, buffers=one.grads, setup=one.setup + one.grads)


def _fsdp(desc: ModelDescription, strategy: Strategy, ranks: int, gpu: bool) -> Held:
    """FSDP1 (flat parameters per unit) and FSDP2 (per-parameter shards), one model.

    Each unit is sharded over ``S`` ranks (all of them, a node for
    HYBRID_SHARD, one for NO_SHARD); parameters in no unit stay whole.  In
    forward the root unit and the unit running are whole, in backward the
    next unit is prefetched too; SHARD_GRAD_OP keeps every unit whole
    between forward and backward.  Mixed precision keeps fp32 shards and
    gathers half-precision copies.  CPU offload keeps shards, gradients and
    the optimizer step in host memory.  FSDP2's forward and backward whole
    units, and its backward moment by moment, are ``fsdp2``'s.
    """
    stored = desc.dtype_bytes  # a shard's value, and a gradient's (mixed precision keeps fp32 shards)
    gathered_bytes = 2 if strategy.half else stored  # a gathered parameter's value, at compute precision
    units = strategy.units or tuple(desc.repeated_blocks)
    unit_numels = desc.units(desc.numel_upto, units)
    outside_units = desc.outside(desc.numel_upto, units)
    root = outside_units if strategy.root_wrapped else 0
    # gathered whole, a packed 4-bit weight keeps its stored bytes (mixed precision casts only the others)
    root_whole = desc.elements_outside(units).bytes(gathered_bytes, stored) if strategy.root_wrapped else 0
    units_whole = [e.bytes(gathered_bytes, stored) for e in desc.elements_in(units).values()]
    unmanaged = 0 if strategy.root_wrapped else outside_units
    sharded = sum(unit_numels.values()) + root
    shard_ranks = {"NO_SHARD": 1, "HYBRID_SHARD": min(ranks, strategy.node_size)}.get(strategy.sharding, ranks)
    if strategy.engine == FSDP1 and ranks == 1:
        shard_ranks = 1
    shard = ceil_div(sharded, shard_ranks)
    largest_unit = max(unit_numels.values(), default=0)
    state_per_element = state_bytes(desc, strategy)
    on_device = 0 if strategy.offload_params else shard
    copies = strategy.engine == FSDP2 or shard_ranks > 1 or strategy.half or strategy.offload_params
    if not copies:
        gathered_forward = gathered_backward = 0
    elif strategy.sharding == "SHARD_GRAD_OP":
        gathered_forward = gathered_backward = root_whole + sum(units_whole)
    else:
        gathered_forward = root_whole + max(units_whole, default=0)
        gathered_backward = root_whole + 2 * max(units_whole, default=0)
    # FSDP1 reduce-scatters the unit's whole gradient into a new shard at compute precision, and under
    # mixed precision casts that shard to the parameters' dtype; the whole gradient lives until both
    # are made.  Unsharded, it reduces in place and casts the whole gradient.
    scattered = ceil_div(largest_unit, shard_ranks) * gathered_bytes if shard_ranks > 1 else 0
    sharded_copy = ceil_div(largest_unit, shard_ranks) * stored if strategy.half else 0
    unit_grads = largest_unit * gathered_bytes + scattered + sharded_copy
    unit_grads = int(unit_grads * desc.trained_share)  # frozen parameters (LoRA's base) get no gradient
    held_numel = on_device + unmanaged
    trained = int(held_numel * desc.trained_share)
    # FSDP1 keeps each unit's shard as one flat tensor, and its gradient as another: each takes a segment
    # of its own, which the allocator may count whole (``allocator.new_segment_block``).
    flat = (beyond_tensors(ceil_div(n, shard_ranks) * stored for n in (*unit_numels.values(), root))
            if gpu and strategy.engine == FSDP1 and not strategy.offload_params else 0)
    held = Held(
        params=held_numel * stored,
        grads=trained * stored,
        params_rounding=flat,
        grads_rounding=flat if desc.trained_share == 1 else 0,
        optimizer=trained * state_per_element,
        host=(shard * (2 * stored + state_per_element)) if strategy.offload_params else 0,
        gathered_forward=gathered_forward,
        gathered_backward=gathered_backward,
        backward_transient=unit_grads,
        step_temporary=step_temporary(strategy, held_numel, desc.largest_param, gpu),
        setup=desc.params * stored if strategy.built_whole else held_numel * stored + flat + 2 * largest_unit * stored,
    )
    if strategy.engine != FSDP2:
        return held
    backward = fsdp2_backward(desc, strategy, shard_ranks)
    if strategy.sharding != "SHARD_GRAD_OP":
        gathered_forward = gathered_in_forward(desc, strategy, gathered_bytes)
    return replace(held, gathered_forward=gathered_forward, gathered_backward=backward.gathered,
                   backward_transient=backward.unit_grads, backward_moments=backward.moments)


def _manual(desc: ModelDescription, strategy: Strategy, *, gpu: bool, batch_scale: float) -> PerRank:
    """One process, parts of the model on different devices: the most loaded accelerator (or the CPU)."""
    by_device: dict[str, tuple[int, ...]] = {}
    for device, rows in strategy.placement:
        if gpu and not device.startswith("cuda"):
            continue
        by_device[device] = by_device.get(device, ()) + tuple(rows)
    best: PerRank | None = None
    for rows in by_device.values():
        numel = sum(desc.subtree(desc.numel_upto, r) for r in rows)
        part_bytes = numel * desc.dtype_bytes
        held = Held(
            params=part_bytes,
            grads=part_bytes,
            optimizer=numel * state_bytes(desc, strategy),
            step_temporary=step_temporary(strategy, numel, desc.largest_param, gpu),
            setup=part_bytes,
        )
        activations = int(saved_activations(desc, strategy, rows) * batch_scale)
        part = _phases(desc, strategy, held, activations, gpu=gpu, batch_scale=batch_scale, rows=tuple(rows))
        if best is None or part.peak > best.peak:
            best = part
    if best is None:
        return per_rank(desc, strategy.with_(engine=SINGLE), 1, gpu=gpu, batch_scale=batch_scale)
    return best


_ENGINES = {
    SINGLE: _single,
    DDP: _ddp,
    ZERO1: zero_held,
    ZERO2: zero_held,
    ZERO3: zero_held,
    FSDP1: _fsdp,
    FSDP2: _fsdp,
}
