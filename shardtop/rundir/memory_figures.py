"""The memory figures events carry: a GPU as NVML saw it, the allocator's numbers, and memory by
kind (``MemorySplit``) with the places that allocated what no source names.

Part of the event contract (``events.py``): plain msgspec structs, importing neither torch nor textual.
"""

from __future__ import annotations

from typing import Literal

import msgspec


class GpuMemory(msgspec.Struct, kw_only=True, omit_defaults=True, frozen=True):
    """One GPU as NVML saw it."""

    index: int
    name: str = ""
    uuid: str = ""
    used: int = 0
    total: int = 0
    util: int | None = None
    temperature: int | None = None
    power_w: float | None = None
    pids: list[int] = []


class MemoryKinds(msgspec.Struct, kw_only=True, omit_defaults=True, frozen=True):
    """Bytes of a rank's device memory by what holds them; each None where its source was not read.

    Every kind is measured from its own source (tensors found, engine buffers read, allocator
    blocks traced); none is the remainder of the others.  A storage is counted once, under the
    first kind that holds it in this order: params, grads, optimizer, comm, other, activations;
    the trace's blocks no census saw as one of those are workspaces, kept from earlier steps, or
    made by the script.
    On CUDA each storage counts as the allocator's block (rounded up to 512 bytes), as
    ``allocated`` does.
    """

    params: int | None = None
    """Parameters: the stored shards (whole parameters, FSDP flat or DTensor shards, ZeRO-3
    ``ds_tensor``), plus gathered, unsharded or low-precision copies while they exist."""
    grads: int | None = None
    """Gradients: ``param.grad``, FSDP sharded gradients and reduce-scatter output, ZeRO-1/2
    gradient partitions, ZeRO-3's partitioned gradient buffer."""
    optimizer: int | None = None
    """Optimizer state: torch optimizers' state tensors; ZeRO's fp32 master partitions and state."""
    activations: int | None = None
    """Tensors saved for backward by the forward, parameters excluded.  Measured only while the
    probe explains a step (its first steps, a request, or ``SHARDTOP_MEMORY_DETAIL=always``)."""
    comm: int | None = None
    """Communication buffers: ZeRO reduce buckets, DDP gradient buckets, FSDP all-gather and
    reduce-scatter buffers."""
    other: int | None = None
    """Module buffers (BatchNorm statistics...), the model's output while it is held and what the loss
    made of it, and, from the allocator's trace, what the backward made (gradients in flight), a
    forward's tensors saved for no backward and the optimizer step's temporaries;
    ``MemorySplit.other_parts`` says how much of each."""
    kept: int | None = None
    """Kept from earlier steps: tensors an earlier step made that are still alive, and no
    parameter, gradient, optimizer state or buffer (a list of each step's logits, a hook's stored
    activations).  From the allocator's trace (a block allocated in an earlier step), and from
    the outputs of the modules whose outputs were seen kept (``Kept``), followed from then on."""
    workspace: int | None = None
    """Library workspaces: cuBLAS and cuBLASLt workspaces, blocks of the size the running torch
    gives them (``torch._C._cuda_getCublasWorkspaceSize``), allocated with no tensor behind them
    and kept for the process's life (one per thread and stream that ran a matmul).  From the
    allocator's trace."""
    script: int | None = None
    """Made by the script: blocks the training script's own code allocated (the innermost frame
    outside torch's Python is in none of the installed libraries), outside any module's forward,
    a loss function, the optimizer, the engine and the backward, in the step split or in set-up:
    its inputs, its own buffers, and what it made of the model's output where no census saw it so
    (``OtherParts.loss``).  Where they were made is in the split's ``script_at``.  From the
    allocator's trace."""


OtherPart = Literal["backward", "output", "loss", "forward", "optimizer", "buffers"]
"""What made a share of ``MemoryKinds.other`` (``OtherParts``' fields)."""

OTHER_PARTS: tuple[OtherPart, ...] = ("backward", "output", "loss", "forward", "optimizer", "buffers")


class OtherParts(msgspec.Struct, kw_only=True, omit_defaults=True, frozen=True):
    """What ``MemoryKinds.other`` holds, by what made it: the parts sum to it.  A part the split's
    sources cannot see is 0 (a census alone sees only the buffers and the model's output)."""

    backward: int = 0
    """Made by autograd in a backward: blocks allocated during a backward with no Python frame (autograd's
    engine, on its own thread) or by the ``backward`` of an autograd Function.  The gradients in flight (an
    activation's gradient on its way to the layer below, the logits' gradient the loss made) and the
    backward's temporaries.  From the allocator's trace."""
    output: int = 0
    """The model's output, still held: the tensors the outermost module call of the latest forward returned
    (a language model's logits, its head's output), seen by a census while the step is explained."""
    loss: int = 0
    """What the loss made of the model's output, still held: an fp32 copy of the logits, their log-softmax.
    Seen by a census (a tensor whose autograd graph leads back to the model's output, made outside the
    model's modules: on the failing stack, held by the script, or saved for the loss's backward), or
    allocated by a loss function's code (``torch.nn.functional.cross_entropy``, ``torch.nn``'s loss
    modules, transformers' losses) outside a backward, as the allocator's trace tells.  A recording made
    before this part was told has it under the script's tensors or the activations."""
    forward: int = 0
    """Made in a module's forward, neither saved for backward nor the model's output: a forward's
    temporaries, or a module's output on its way.  At a moment inside a module's forward (an OOM raised
    there: ``read/other_parts.running_forward``) it is what the forward running then was making, which grows
    with the tokens of a micro-batch: "saved for no backward" only once that forward is over.  From the
    allocator's trace."""
    optimizer: int = 0
    """The optimizer step's temporaries (``torch.optim``'s foreach intermediates).  From the allocator's trace."""
    buffers: int = 0
    """Module buffers (BatchNorm's running statistics...)."""


class AllocationSite(msgspec.Struct, kw_only=True, omit_defaults=True, frozen=True):
    """Where some blocks were allocated: the innermost frame outside torch's own Python, as
    ``path:line in function`` (the path from below the folder the process imported it from, such as
    ``site-packages``, else the file's name), or ``""`` where the
    allocation had no Python frame (torch's C++ code, such as autograd's engine thread)."""

    where: str
    bytes: int
    part: OtherPart | None = None
    """For a place of ``other``'s blocks: which of its parts they are (None: not told, as in a recording
    made before parts were)."""


class MemorySplit(msgspec.Struct, kw_only=True, omit_defaults=True, frozen=True):
    """What fills a rank's allocated memory at one moment: ``by_kind`` plus ``unexplained``."""

    allocated: int | None = None
    """The allocator's allocated bytes at that moment; None on CPU (no caching allocator)."""
    by_kind: MemoryKinds = msgspec.field(default_factory=MemoryKinds)
    unexplained: int | None = None
    """``allocated`` minus every kind measured: what no source accounts for (rarely exactly 0;
    negative only if the sources and the allocator were read a moment apart).  None on CPU."""
    source: str = "tensors"
    """``tensors``: the tensors and engine buffers found at that moment (``by_kind`` summed);
    ``allocator-trace``: the CUDA allocator's recorded blocks at that moment, each classified
    by the tensor found at its address or by the code that allocated it."""
    step: int | None = None
    """The training step of that moment, when known."""
    phase: str = ""
    """The phase of that moment (setup, forward, backward, optimizer...), when known."""
    unexplained_at: list[AllocationSite] = []
    """Where the largest unexplained bytes were allocated, largest first (at most three); from
    the allocator's trace only."""
    script_at: list[AllocationSite] = []
    """Where the script made its largest tensors of ``by_kind.script``, largest first (at most three)."""
    kept_at: list[AllocationSite] = []
    """Where the largest tensors of ``by_kind.kept`` were made, largest first (at most three); from the
    allocator's trace only."""
    other_at: list[AllocationSite] = []
    """Where the largest blocks of ``by_kind.other`` were allocated (an optimizer step's temporaries, module
    buffers...), with their part, largest first (at most three); from the allocator's trace only."""
    other_parts: OtherParts | None = None
    """``by_kind.other`` by what made it; None where not told (a recording made before parts were: a
    reader derives what it can from ``other_at``)."""


class AllocatorStats(msgspec.Struct, kw_only=True, omit_defaults=True, frozen=True):
    """The CUDA caching allocator's key numbers (``torch.cuda.memory_stats``), in bytes and counts."""

    allocated: int
    reserved: int
    active: int | None = None
    """Allocated plus blocks freed but still in use by another stream."""
    inactive_split: int | None = None
    """Free bytes inside split blocks: fragmentation the allocator cannot hand out whole."""
    peak_allocated: int | None = None
    """``max_memory_allocated``: the highest ``allocated`` since the process started."""
    peak_reserved: int | None = None
    num_alloc_retries: int | None = None
    """How often a cudaMalloc failed and the allocator freed its cache to retry."""
    num_ooms: int | None = None
    largest_free_block: int | None = None
    """The largest free block inside reserved memory; only where a memory snapshot was taken (at an OOM)."""
