"""DeepSpeed ZeRO 1, 2 and 3 on one rank: what it holds, and what its set-up allocates, in order.

Read from DeepSpeed's ``stage3.py`` and ``stage_1_and_2.py`` (0.15-0.19).
Parameters are stored in the compute dtype (DeepSpeed casts the model for
fp16/bf16); gradients and the reduce buckets too.

ZeRO-3 set-up (``DeepSpeedZeroOptimizer_Stage3.__init__``), with nothing
offloaded:

- the partitions, as ``zero.Init`` makes them (each module whole for a
  moment), or the whole model first when it was built outside ``zero.Init``;
- ``defragment``: the partitions go through host memory, the cache is
  emptied, and they come back as one flat buffer;
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

ZeRO-1/2 set-up (``DeepSpeedZeroOptimizer.__init__``): the whole model on the
device, one flat copy of it, the partition's fp32 master copy, and the same
temporary fp32 gradient of the partition.  Their reduce buckets (two with
``overlap_comm``) and ZeRO-2's gradient partition exist only from the first
gradient of a backward pass to the step, which frees the gradients.
"""

from __future__ import annotations

from shardtop.plan.allocator import Alloc, EmptyCache, Free, Step, need
from shardtop.plan.description import ModelDescription
from shardtop.plan.held import Held, step_temporary
from shardtop.plan.strategies import Strategy

PARAMETERS = "the parameters' partitions"
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


def zero_held(desc: ModelDescription, s: Strategy, n: int, gpu: bool) -> Held:
    return _stage3(desc, s, n, gpu) if s.engine == "zero3" else _stage1_2(desc, s, n, gpu)


def _stage3(desc: ModelDescription, s: Strategy, n: int, gpu: bool) -> Held:
    z, psi = s.zero, desc.params
    pb = 2 if s.half else desc.dtype_bytes
    part = -(-psi // n)
    # The largest sub-group: parameters are added to one until it reaches ``sub_group_size``.
    sub = min(part, z.sub_group_size + -(-desc.largest_param // n))
    small = desc.small_upto[-1] * pb
    bucket = z.reduce_bucket_size * pb if z.contiguous_gradients else 0
    reduced = min(psi, z.reduce_bucket_size) * pb * (1 if bucket else 2)
    on_device = not s.offload_optimizer
    trained = -(-desc.trained // n)  # ZeRO makes fp32 partitions and state for the optimizer's parameters only
    states = trained * (4 + s.optimizer.state_bytes)
    module = desc.largest_param * pb if n > 1 else 0
    # At one rank DeepSpeed gathers nothing: the partition is the parameter (``_no_gather_coalesced``).
    gathered = (min(psi, z.max_live_parameters + desc.largest_param) + min(psi, z.prefetch_bucket_size)) * pb
    gathered = gathered if n > 1 else 0
    fp32_gradient = sub * 4 + max(step_temporary(s, sub, sub, gpu), sub * pb if pb != 4 else 0)
    setup = need(_stage3_setup(s, psi * pb, part, pb, sub, small, module, bucket))
    return Held(
        params=(0 if s.offload_params else part * pb) + small,
        grads=trained * pb if on_device else 0,
        optimizer=states if on_device else 0,
        optimizer_before_step=trained * 4 if on_device else 0,
        buffers=bucket,
        host=(0 if on_device else states) + (part * pb if s.offload_params else 0),
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


def _stage3_setup(s: Strategy, whole: int, part: int, pb: int, sub: int, small: int, largest: int,
                  bucket: int) -> list[Step]:
    steps: list[Step] = []
    if s.built_whole:
        steps += [Alloc(WHOLE, whole, scattered=True), Free(WHOLE)]
    if not s.offload_params:
        steps.append(Alloc(PARAMETERS, part * pb, scattered=True))
        if not s.built_whole:
            steps += [Alloc(BUILDING, largest), Free(BUILDING)]
    steps += [Alloc(PERSISTENT, small, scattered=True), Free(PARAMETERS), EmptyCache()]
    if not s.offload_params:
        steps.append(Alloc(FLAT, part * pb))
    if not s.offload_optimizer:
        converted = pb != 4 or s.offload_params
        if converted:
            steps.append(Alloc(CONVERSION, part * 4))
        steps.append(Alloc(MASTER, part * 4))
        if converted:
            steps.append(Free(CONVERSION))
        steps += [Alloc(FIRST_GRADIENT, sub * 4), Free(FIRST_GRADIENT)]
    steps.append(Alloc(BUCKET, bucket))
    if not s.offload_optimizer:
        steps.append(Alloc(GRADIENTS, part * pb))
    return steps


def _stage1_2(desc: ModelDescription, s: Strategy, n: int, gpu: bool) -> Held:
    stage = int(s.engine[-1])
    z, psi = s.zero, desc.params
    pb = 2 if s.half else desc.dtype_bytes
    part = -(-psi // n)
    trained = -(-desc.trained // n)
    overlap = bool(z.overlap_comm)
    buckets = z.reduce_bucket_size * pb * (2 if overlap else 1) if z.contiguous_gradients else 0
    states = trained * (4 + s.optimizer.state_bytes)
    staging = desc.largest_param * pb if s.offload_optimizer else 0
    grads = desc.trained * pb if stage == 1 else trained * pb
    setup = need(_stage1_2_setup(s, psi * pb, part, pb, staging))
    return Held(
        params=psi * pb,
        grads=0 if s.offload_optimizer and stage == 2 else grads,
        optimizer=0 if s.offload_optimizer else states,
        optimizer_before_step=0 if s.offload_optimizer else part * 4,
        buffers=staging,
        backward_buffers=buckets,
        host=states if s.offload_optimizer else 0,
        grads_freed_by_step=True,
        step_temporary=0 if s.offload_optimizer else part * 4 + step_temporary(s, part, part, gpu),
        setup=setup.held,
        setup_requests=setup.requests,
    )


def _stage1_2_setup(s: Strategy, whole: int, part: int, pb: int, staging: int) -> list[Step]:
    """The model whole, its flat copy, then the partition's fp32 master copy and first gradient."""
    master = MASTER if pb == 4 and not s.offload_optimizer else PARTITION_COPY
    steps: list[Step] = [Alloc(WHOLE, whole, scattered=True), Alloc(FLAT, whole), Free(WHOLE),
                         Alloc(master, part * pb)]
    if not s.offload_optimizer:
        if master != MASTER:
            steps += [Alloc(MASTER, part * 4), Free(master)]
        steps += [Alloc(FIRST_GRADIENT, part * 4), Free(FIRST_GRADIENT)]
    else:
        steps.append(Free(master))
    steps.append(Alloc(STAGING, staging))
    return steps
