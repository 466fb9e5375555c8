"""DeepSpeed ZeRO 1, 2 and 3 on one rank: what it holds, and what its set-up allocates, in order.

Read from DeepSpeed's ``stage3.py`` and ``stage_1_and_2.py`` (0.15-0.19).
Parameters are stored in the compute dtype (DeepSpeed casts the model for
fp16/bf16); gradients and the reduce buckets too.  A packed 4-bit weight
(bitsandbytes') stays as stored: its user packs it in the dtype the rest of
the model is in.  ZeRO makes its flat buffer, fp32 master copy, gradients and
optimizer state for the trainable parameters alone (``requires_grad``: a
LoRA's adapters); the frozen ones keep the partitions (ZeRO-3) or the whole
copies (ZeRO-1/2) they were given.

ZeRO-3 set-up (``DeepSpeedZeroOptimizer_Stage3.__init__``), with nothing
offloaded:

- the partitions, as ``zero.Init`` makes them (each module whole for a
  moment), or the whole model first when it was built outside ``zero.Init``;
- ``defragment``: the trainable parameters' partitions go through host
  memory, the cache is emptied, and they come back as one flat buffer;
- ``_create_fp32_partitions``: the fp32 master copy of the partition (a
  clone even in fp32; from fp16/bf16 a converted copy first);
- ``initialize_optimizer_states``: an fp32 gradient buffer as large as the
  largest sub-group, freed again (Adam's moments are not made here: since
  DeepSpeed 0.13.2 no step runs at set-up, and torch makes them at the first);
- the reduce (IPG) bucket, ``reduce_bucket_size`` elements
  (``contiguous_gradients``), cut by the allocator from that freed buffer
  where it fits there;
- the flat buffer of gradient partitions, which then no longer does.

ZeRO-3 keeps parameters under the persistence threshold whole.  In the
first step it records the order of the modules and gathers each module's
parameters only while it runs.  From the second step on it prefetches,
``prefetch_bucket_size`` elements at a time, until ``max_live_parameters``
elements are whole, and keeps parameters it will use again soon (it has
already prefetched their next use, or they come back within
``max_reuse_distance``); each prefetch goes through a flat buffer of the
bucket's size beside the parameters' own copies.  In backward the bucket's
gradients are flattened for the reduce-scatter, into memory that the
parameters released by then leave free.  Its step makes the fp32 gradient of
each sub-group, then the torch optimizer its state and temporaries.

Offloaded (``offload_optimizer``, ``offload_param``), what moves to host
memory is counted in ``Held.host``, not on the device: the fp32 master
partition and the optimizer's state, and, as DeepSpeed keeps them there
between steps, the gradient partitions (ZeRO-3's flat buffer is made on the
optimizer's device, the host) and an fp32 gradient beside each offloaded
master partition (ZeRO-1/2: its only gradient partition); ZeRO-3's parameter
partitions too under ``offload_param``.  DeepSpeed's own host staging copies
(ZeRO-1/2's half-precision copy of the partition, pinned swap buffers) are
not counted.

ZeRO-1/2 set-up (``DeepSpeedZeroOptimizer.__init__``): the whole model on the
device, one flat copy of it, the partition's fp32 master copy, and the same
temporary fp32 gradient of the partition.  Their reduce buckets (two with
``overlap_comm``) and ZeRO-2's gradient partition exist only from the first
gradient of a backward pass to the step, which frees the gradients.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from shardtop.plan.allocator import Alloc, EmptyCache, Free, Step, need
from shardtop.plan.description import ModelDescription
from shardtop.plan.held import Held, step_temporary
from shardtop.plan.strategies import Strategy
from shardtop.rundir.engines import ZERO3
from shardtop.units import ceil_div

PARAMETERS = "the parameters' partitions"
FROZEN = "the frozen parameters' partitions"
FROZEN_WHOLE = "the frozen parameters, moved to the device"
WHOLE = "the whole model, moved to the device"
BUILDING = "a module's parameters, whole as zero.Init makes them"
PERSISTENT = "the parameters kept whole (under the persistence threshold)"
FLAT = "the flat parameter buffer"
CONVERSION = "the fp32 conversion of the partition"
MASTER = "the fp32 master copy"
FIRST_GRADIENT = "the optimizer's fp32 gradient buffer of its set-up"
BUCKET = "the reduce bucket"
GRADIENTS = "the gradient partitions"
PARTITION_COPY = "the copy of the partition"
STAGING = "the gradient staging buffer for the offloaded optimizer"
MASTER_GRADIENT_BYTES = 4
"""The fp32 gradient DeepSpeed keeps beside each offloaded master partition, per element."""


def zero_held(desc: ModelDescription, strategy: Strategy, ranks: int, gpu: bool) -> Held:
    if strategy.engine == ZERO3 and not gpu and (strategy.offload_optimizer or strategy.offload_params):
        return _offloaded_on_cpu(desc, strategy, ranks)
    stage = _stage3 if strategy.engine == ZERO3 else _stage1_2
    return stage(desc, strategy, ranks, gpu)


def _offloaded_on_cpu(desc: ModelDescription, strategy: Strategy, ranks: int) -> Held:
    """ZeRO-3 offloading on CPU processes: what it moves to host memory stays in the process's own, so the
    rank holds what it would without the offload, and the fp32 gradient DeepSpeed keeps beside each
    offloaded master partition between steps (``offload_optimizer``)."""
    held = _stage3(desc, strategy.with_(offload_optimizer=False, offload_params=False), ranks, False)
    if not strategy.offload_optimizer:
        return held
    master_grads = ceil_div(desc.trained, ranks) * MASTER_GRADIENT_BYTES
    return replace(held, grads=held.grads + master_grads)


def _stage3(desc: ModelDescription, strategy: Strategy, ranks: int, gpu: bool) -> Held:
    zero, numel, stored = strategy.zero, desc.params, desc.dtype_bytes
    param_bytes = 2 if strategy.half else stored
    elements = desc.elements  # a packed 4-bit weight stays as stored under fp16/bf16 too
    partition = elements.share_bytes(ranks, param_bytes, stored)
    # ZeRO makes its flat buffer, fp32 partitions, gradients and state for the trainable parameters only
    trained = ceil_div(desc.trained, ranks)
    frozen = max(0, partition - trained * param_bytes)
    # The largest sub-group: parameters are added to one until it reaches ``sub_group_size``.
    sub_group = min(trained, zero.sub_group_size + ceil_div(desc.largest_param, ranks))
    # kept whole beside the partitions; at one rank a gathered parameter is a view of its partition
    persistent = desc.persistent(zero.param_persistence_threshold, zero.model_persistence_threshold)
    small = persistent.bytes(param_bytes, stored) if ranks > 1 or strategy.offload_params else 0
    bucket = zero.reduce_bucket_size * param_bytes if zero.contiguous_gradients else 0
    reduced = min(numel, zero.reduce_bucket_size) * param_bytes * (1 if bucket else 2)
    on_device = not strategy.offload_optimizer
    states = trained * (4 + strategy.optimizer.state_bytes)
    module = desc.largest_param_bytes(param_bytes) if ranks > 1 else 0
    # At one rank DeepSpeed gathers nothing: the partition is the parameter (``_no_gather_coalesced``).
    live = min(numel, zero.max_live_parameters + desc.largest_param) + min(numel, zero.prefetch_bucket_size)
    gathered = live * param_bytes + min(live, elements.packed) * (stored - param_bytes)
    gathered = gathered if ranks > 1 else 0
    half_copy = sub_group * param_bytes if param_bytes != 4 else 0
    fp32_gradient = sub_group * 4 + max(step_temporary(strategy, sub_group, sub_group, gpu), half_copy)
    setup = need(_stage3_setup(strategy, Stage3Setup(
        whole=elements.bytes(param_bytes, stored), frozen=frozen, trained=trained, param_bytes=param_bytes,
        sub_group=sub_group, small=small, largest=module, bucket=bucket)))
    return Held(
        params=(0 if strategy.offload_params else partition) + small,
        grads=trained * param_bytes if on_device else 0,
        optimizer=states if on_device else 0,
        optimizer_before_step=trained * 4 if on_device else 0,
        buffers=bucket,
        host=(0 if on_device else states + trained * (param_bytes + MASTER_GRADIENT_BYTES))
        + (partition if strategy.offload_params else 0),
        gathered_forward=gathered,
        gathered_backward=gathered,
        first_gathered=module,
        grads_persist=True,
        grads_freed_by_step=True,
        backward_transient=max(0, reduced - gathered),
        first_backward_transient=max(0, reduced - module),
        step_temporary=fp32_gradient if on_device else 0,
        setup=setup.held,
        setup_requests=setup.requests,
    )


@dataclass(frozen=True)
class Stage3Setup:
    """The sizes ZeRO-3's set-up allocates: bytes, but ``trained`` and ``sub_group`` in elements."""

    whole: int
    """The model whole (built outside ``zero.Init``)."""
    frozen: int
    """The frozen parameters' partitions: made and kept as they are (no flat buffer, no master copy)."""
    trained: int
    """The trainable parameters' partition, in elements."""
    param_bytes: int
    sub_group: int
    small: int
    largest: int
    bucket: int


def _stage3_setup(strategy: Strategy, sizes: Stage3Setup) -> list[Step]:
    param_bytes, partition = sizes.param_bytes, sizes.trained
    steps: list[Step] = []
    if strategy.built_whole:
        steps += [Alloc(WHOLE, sizes.whole, scattered=True), Free(WHOLE)]
    if not strategy.offload_params:
        steps += [Alloc(FROZEN, sizes.frozen, scattered=True), Alloc(PARAMETERS, partition * param_bytes,
                                                                     scattered=True)]
        if not strategy.built_whole:
            steps += [Alloc(BUILDING, sizes.largest), Free(BUILDING)]
    steps += [Alloc(PERSISTENT, sizes.small, scattered=True), Free(PARAMETERS), EmptyCache()]
    if not strategy.offload_params:
        steps.append(Alloc(FLAT, partition * param_bytes))
    if not strategy.offload_optimizer:
        converted = param_bytes != 4 or strategy.offload_params
        if converted:
            steps.append(Alloc(CONVERSION, partition * 4))
        steps.append(Alloc(MASTER, partition * 4))
        if converted:
            steps.append(Free(CONVERSION))
        steps += [Alloc(FIRST_GRADIENT, sizes.sub_group * 4), Free(FIRST_GRADIENT)]
    steps.append(Alloc(BUCKET, sizes.bucket))
    if not strategy.offload_optimizer:
        steps.append(Alloc(GRADIENTS, partition * param_bytes))
    return steps


def _stage1_2(desc: ModelDescription, strategy: Strategy, ranks: int, gpu: bool) -> Held:
    stage = int(strategy.engine[-1])
    zero, stored = strategy.zero, desc.dtype_bytes
    param_bytes = 2 if strategy.half else stored
    whole = desc.elements.bytes(param_bytes, stored)  # a packed 4-bit weight stays as stored under fp16/bf16
    # the flat buffer, master partition, gradients and state are the trainable parameters' only
    trained_whole = desc.trained * param_bytes
    trained = ceil_div(desc.trained, ranks)
    overlap = bool(zero.overlap_comm)
    buckets = zero.reduce_bucket_size * param_bytes * (2 if overlap else 1) if zero.contiguous_gradients else 0
    states = trained * (4 + strategy.optimizer.state_bytes)
    staging = desc.largest_param * param_bytes if strategy.offload_optimizer else 0
    grads = trained_whole if stage == 1 else trained * param_bytes
    setup = need(_stage1_2_setup(strategy, whole - trained_whole, trained_whole, trained, param_bytes, staging))
    return Held(
        params=whole,
        grads=0 if strategy.offload_optimizer and stage == 2 else grads,
        optimizer=0 if strategy.offload_optimizer else states,
        optimizer_before_step=0 if strategy.offload_optimizer else trained * 4,
        buffers=staging,
        backward_buffers=buckets,
        host=states + trained * MASTER_GRADIENT_BYTES if strategy.offload_optimizer else 0,
        grads_freed_by_step=True,
        step_temporary=(
            0 if strategy.offload_optimizer else trained * 4 + step_temporary(strategy, trained, trained, gpu)
        ),
        setup=setup.held,
        setup_requests=setup.requests,
    )


def _stage1_2_setup(strategy: Strategy, frozen: int, whole: int, partition: int, param_bytes: int, staging: int
                    ) -> list[Step]:
    """The model whole (the frozen parameters stay so), the trainable parameters' flat copy, then their
    partition's fp32 master copy and first gradient."""
    master = MASTER if param_bytes == 4 and not strategy.offload_optimizer else PARTITION_COPY
    steps: list[Step] = [Alloc(FROZEN_WHOLE, frozen, scattered=True), Alloc(WHOLE, whole, scattered=True),
                         Alloc(FLAT, whole), Free(WHOLE), Alloc(master, partition * param_bytes)]
    if not strategy.offload_optimizer:
        if master != MASTER:
            steps += [Alloc(MASTER, partition * 4), Free(master)]
        steps += [Alloc(FIRST_GRADIENT, partition * 4), Free(FIRST_GRADIENT)]
    else:
        steps.append(Free(master))
    steps.append(Alloc(STAGING, staging))
    return steps
