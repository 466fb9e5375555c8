"""What would have avoided an OOM, from what filled the rank's memory at it.

The fix follows the kind that held the most at the OOM (``Oom.memory``), so a
finding never offers what cannot help: sharding frees parameters, gradients
and optimizer state, not activations; activation checkpointing and a smaller
micro-batch free activations, not tensors a loop keeps; none of them frees a
library's workspace.  Tensors kept from earlier forwards with their autograd
graph (an evaluation without ``torch.no_grad()``) are told as such, with what
holds them.  Where ``other`` filled it, its largest part decides: gradients in
flight in the backward, and the model's output (logits) with what the loss made
of it (an fp32 copy, a log-softmax), shrink with the tokens of a micro-batch,
not with sharding; so does what the forward running at the OOM was making (its
activations on their way, its temporaries), which is "saved for no backward"
only once that forward is over.  A request that is a copy of the logits of
a large vocabulary on the failing stack (a loss upcasting them) is told as
tokens × vocabulary.
Where the memory at the OOM was not split, the fix says so and falls back to
what usually fills the phase it struck in.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from shardtop.diagnose.facts import ENGINE_WORDS, KindsEvidence, OomEvidence, fmt
from shardtop.diagnose.finding import Evidence
from shardtop.read.other_parts import RUNNING_FORWARD_WORDS, parts_words
from shardtop.rundir.engines import FSDP_ENGINES, OPTIMIZER_SHARDING_ENGINES, SHARDED_ENGINES, ZERO3, ZERO_ENGINES
from shardtop.rundir.events import StackTensor

REDUCE_BUCKET_BYTES = 500_000_000 * 4
"""DeepSpeed's default ``reduce_bucket_size`` (5e8 elements) in fp32."""

LIGHTER_OPTIMIZER = "a lighter optimizer (SGD with momentum keeps one copy, 8-bit Adam a quarter)"

KIND_WORDS = {
    "params": "parameters", "grads": "gradients", "optimizer": "optimizer state", "activations": "activations",
    "comm": "communication buffers", "kept": "tensors kept from earlier forwards", "workspace": "library workspaces",
    "script": "tensors the script made itself", "other": "other tensors (module buffers, temporaries)",
    "unexplained": "memory no source explains",
}

DOMINANT_SHARE = 0.5
"""A kind "filled" the memory at an OOM from half of what was held up: then the fix is that kind's alone."""

LOGITS_MIN_VOCAB = 8192
"""A last dimension at least this large is taken for a vocabulary's (logits)."""
COPY_DEPTH = 1
"""A copy is made by the frame the OOM was raised in, or its caller: a tensor held further out (a list of
outputs a loop keeps) is not what the failing request copies."""
COPY_SLACK = 1 << 20
"""How far a request may be from a tensor's size and still be its copy (allocator rounding, padding)."""


@dataclass(frozen=True)
class OutOfMemory(Evidence):
    oom: OomEvidence
    found_by: str
    engine: str
    world_size: int
    block_type: str
    others: tuple[str, ...]
    """The other ranks' OOMs, in words: ``rank 1 during setup in net.3``."""
    peak: KindsEvidence | None = None
    """What filled the rank's memory at its peak, by kind, where the probe split it."""
    at_oom: KindsEvidence | None = None
    """What filled it at the OOM, by kind, where the probe split it."""
    kept_graph_bytes: int | None = None
    """Of the kept tensors at the OOM, those held through earlier forwards' autograd graphs."""
    kept_by: str = ""
    """What holds kept outputs of earlier forwards on the failing stack, in words."""
    stack_tensors: tuple[StackTensor, ...] = ()
    """The largest tensors the failing stack held."""


def offload_words(engine: str) -> str:
    if engine in ZERO_ENGINES:
        return "DeepSpeed `offload_optimizer: {device: cpu}`"
    if engine in FSDP_ENGINES:
        return "FSDP `CPUOffload(offload_params=True)`, FSDP2 `CPUOffloadPolicy()`"
    return "DeepSpeed ZeRO-Offload"


def held_at_oom(e: OutOfMemory) -> dict[str, int]:
    """What held the rank's memory at the OOM, by kind (measured kinds; the unexplained part where the
    allocator said how much was allocated)."""
    split = e.at_oom
    if split is None:
        return {}
    held = {kind: n for kind, n in split.by_kind.items() if n}
    if split.unexplained:
        held["unexplained"] = split.unexplained
    return held


def dominant(e: OutOfMemory) -> tuple[str, int] | None:
    """The kind that held at least half of the memory at the OOM, and its bytes; None where none did (or the
    memory was not split)."""
    held = held_at_oom(e)
    total = sum(held.values())
    if not total:
        return None
    kind = max(held, key=held.__getitem__)
    return (kind, held[kind]) if held[kind] >= DOMINANT_SHARE * total else None


def oom_fix(e: OutOfMemory) -> str:
    """The fix of the kind that filled the memory at the OOM, the phase's usual one where none did; where the
    failing request is DeepSpeed's default reduce bucket, with what makes that request smaller."""
    fix = _fix_of_what_filled(e)
    if _asks_for_the_bucket(e) and "reduce_bucket_size" not in fix:
        fix += (
            f" The failing request itself is DeepSpeed's default reduce bucket (5e8 elements, "
            f"{fmt(REDUCE_BUCKET_BYTES)} in fp32): a lower `reduce_bucket_size` in `zero_optimization` (e.g. 5e7) "
            "asks for less."
        )
    return fix


def _asks_for_the_bucket(e: OutOfMemory) -> bool:
    return e.engine in ZERO_ENGINES and e.oom.requested_bytes == REDUCE_BUCKET_BYTES


def _fix_of_what_filled(e: OutOfMemory) -> str:
    copied = logits_copy(e)
    if copied is not None:
        return _logits_fix(*copied)
    found = dominant(e)
    kind = found[0] if found else ""
    if kind == "kept":
        return _kept_fix(e, found[1] if found else 0)
    if kind == "activations":
        return _activations_fix(e)
    if kind in ("grads", "optimizer"):
        return _state_fix(e)
    if kind == "params":
        return _setup_fix(e) if e.oom.phase == "setup" else _params_fix(e)
    if kind == "comm":
        return _bucket_fix(e)
    if kind == "other" and (part_fix := _other_part_fix(e, found[1] if found else 0)) is not None:
        return part_fix
    if kind:
        return (
            f"At the OOM most of the memory ({fmt(found[1] if found else 0)}) was {KIND_WORDS.get(kind, kind)}, "
            "which sharding, activation checkpointing and a smaller micro-batch do not reduce: "
            + _where_kind(kind)
        )
    if held_at_oom(e):
        return _mixed_fix(e)
    return "What filled the memory at the OOM was not measured on this rank. " + _phase_fix(e)


def logits_copy(e: OutOfMemory) -> tuple[StackTensor, int, int] | None:
    """A tensor of logits on the failing stack (its last dimension a vocabulary's) of which the failing request
    is a copy at 2, 4 or 8 bytes a value, with that itemsize and the request; None where there is none.
    The tensor must be held by the frame that asked or its caller (``COPY_DEPTH``): a request as large as
    logits held further out is new logits, not their copy."""
    asked = e.oom.requested_bytes
    if not asked:
        return None
    for tensor in e.stack_tensors:
        if tensor.depth is None or tensor.depth > COPY_DEPTH:
            continue
        if len(tensor.shape) < 2 or tensor.shape[-1] < LOGITS_MIN_VOCAB:
            continue
        values = math.prod(tensor.shape)
        for itemsize in (4, 2, 8):
            if abs(asked - values * itemsize) <= max(COPY_SLACK, asked // 100):
                return tensor, itemsize, asked
    return None


def _logits_fix(tensor: StackTensor, itemsize: int, asked: int) -> str:
    dims = " × ".join(f"{n:,}" for n in tensor.shape)
    tokens = math.prod(tensor.shape[:-1])
    copy = {4: "fp32", 2: "16-bit", 8: "fp64"}[itemsize]
    return (
        f"The OOM asked for {fmt(asked)}: a {copy} copy of `{tensor.name}` ({dims} values, {tensor.dtype}, made in "
        f"{tensor.where}), as a loss makes of the logits (an upcast, a log-softmax). Logits take tokens × "
        f"vocabulary × bytes, here {tokens:,} tokens × {tensor.shape[-1]:,}, and the loss holds more than one such "
        "copy. Fewer tokens per micro-batch, a chunked or fused linear-cross-entropy loss that never holds the "
        "whole logits (Liger's `LigerFusedLinearCrossEntropyLoss`, or the loss over chunks of the sequence), or "
        "only the logits the loss needs (transformers: `logits_to_keep`) reduce them; sharding and activation "
        "checkpointing do not."
    )


def _kept_fix(e: OutOfMemory, kept: int) -> str:
    graphs = e.kept_graph_bytes or 0
    holder = f" ({e.kept_by})" if e.kept_by else ""
    if graphs * 2 >= kept:
        return (
            f"Most of the memory at the OOM ({fmt(kept)}) is kept from earlier forwards with their autograd graphs: "
            f"their outputs are kept{holder}, and each holds everything its forward saved for a backward that never "
            "runs. Run what only evaluates under `torch.no_grad()` or `torch.inference_mode()`, or keep "
            "`.detach()`ed copies (`.item()`, `.cpu()` for what is logged). A smaller batch, activation "
            "checkpointing or sharding only delays it."
        )
    return (
        f"Most of the memory at the OOM ({fmt(kept)}) is tensors kept from earlier steps or forwards, not the "
        f"work of the one running: find what keeps a reference to each one's tensors{holder} (a list outputs are "
        "appended to, a hook, a metric or a log that stores the tensor rather than `.item()` or a detached CPU "
        "copy) and let go of it, or move what must be kept to the CPU as it is made."
    )


def _other_part_fix(e: OutOfMemory, other: int) -> str | None:
    """The fix of what held most of ``other`` at the OOM (``read/other_parts.py``): the backward's part where it
    held half; the logits' where the model's output and what the loss made of it held half together; the parts,
    where none held half; None where the parts were not told or the largest has no fix of its own."""
    parts = e.at_oom.other_parts if e.at_oom is not None else {}
    if not parts or not other:
        return None
    running = e.at_oom is not None and e.at_oom.running_forward
    part = max(parts, key=parts.__getitem__)
    if part == "forward" and running and parts[part] >= DOMINANT_SHARE * other:
        return _running_forward_fix(e, other, parts[part])
    if part == "backward" and parts[part] >= DOMINANT_SHARE * other:
        return (
            f"At the OOM most of the memory ({fmt(other)} other, {fmt(parts[part])} of it) was gradients in flight, "
            "made by autograd in the backward: each activation's gradient, and that of what the loss was computed "
            "from (a language model's logits). They grow with the tokens of a micro-batch: fewer tokens per "
            "micro-batch reduce them, and for a large vocabulary a chunked or fused linear-cross-entropy loss (Liger's "
            "`LigerFusedLinearCrossEntropyLoss`, or the loss over chunks of the sequence); sharding the model "
            "does not."
        )
    if parts.get("output", 0) + parts.get("loss", 0) >= DOMINANT_SHARE * other:
        return _logits_share_fix(other, parts.get("output", 0), parts.get("loss", 0))
    if parts[part] < DOMINANT_SHARE * other:
        return (
            f"At the OOM most of the memory ({fmt(other)}) was other tensors, no part of them half: "
            f"{parts_words(parts, other, 0.0, running)}. Sharding does not reduce them; " + _where_kind("other")
        )
    return None


def _running_forward_fix(e: OutOfMemory, other: int, forward: int) -> str:
    """Half of ``other`` at an OOM inside a forward was what that forward was making."""
    module = f" (`{e.oom.module}`)" if e.oom.module else ""
    return (
        f"At the OOM most of the memory ({fmt(other)} other, {fmt(forward)} of it) was {RUNNING_FORWARD_WORDS}: "
        f"fewer tokens per micro-batch (a smaller micro-batch or a shorter sequence) reduce them. Activation "
        f"checkpointing keeps less of each layer once it is done, not what the layer that failed{module} makes "
        "while it runs; sharding the model does not reduce them. The places that made them are listed with the "
        "memory split."
    )


LOGITS_REMEDY = (
    "Fewer tokens per micro-batch, a chunked or fused linear-cross-entropy loss that never holds the whole logits "
    "(Liger's `LigerFusedLinearCrossEntropyLoss`, or the loss over chunks of the sequence), or only the logits the "
    "loss needs (transformers: `logits_to_keep`) reduce it; sharding and activation checkpointing do not."
)


def _logits_share_fix(other: int, output: int, loss: int) -> str:
    """The model's output (logits) and what the loss made of it held half of ``other``."""
    if not loss:
        return (
            f"At the OOM most of the memory ({fmt(other)} other, {fmt(output)} of it) was the model's output, "
            "still held (a language model's logits: tokens × vocabulary × bytes). " + LOGITS_REMEDY
        )
    held = f"{fmt(output)} the output, {fmt(loss)} the loss's" if output else f"{fmt(loss)} of it"
    return (
        f"At the OOM most of the memory ({fmt(other)} other; {held}) was the model's output and what the loss made "
        "of it (an fp32 copy of the logits, their log-softmax): a language model's logits take tokens × "
        "vocabulary × bytes, and the loss holds more than one such copy. " + LOGITS_REMEDY
    )


def _activations_fix(e: OutOfMemory) -> str:
    gathered = " (plus the gathered parameters of the running unit)" if e.engine in SHARDED_ENGINES else ""
    block = f"each {e.block_type}" if e.block_type else "each block"
    return (
        f"Activations filled the memory{gathered}: a smaller micro-batch or sequence length, or activation "
        f"checkpointing on {block}. Sharding the model does not reduce them."
    )


def _state_fix(e: OutOfMemory) -> str:
    engine = ENGINE_WORDS.get(e.engine, e.engine or "the engine")
    if e.engine in OPTIMIZER_SHARDING_ENGINES:
        return (
            f"Gradients and optimizer state filled the memory, and {engine} already shards them over the "
            f"{e.world_size} rank(s): run on more GPUs, {offload_words(e.engine)}, use {LIGHTER_OPTIMIZER}, or a "
            "smaller model."
        )
    return (
        "Gradients and optimizer state filled the memory (Adam keeps twice the parameters, in fp32): shard them "
        f"(ZeRO-1/2, FSDP), {offload_words(e.engine)}, or use {LIGHTER_OPTIMIZER}."
    )


def _params_fix(e: OutOfMemory) -> str:
    if e.engine in SHARDED_ENGINES:
        return "Parameters filled the memory, sharded already: run on more ranks, or offload them to CPU."
    return "Parameters filled the memory: shard the model (FSDP, ZeRO-3) or offload it."


def _setup_fix(e: OutOfMemory) -> str:
    engine = ENGINE_WORDS.get(e.engine, e.engine or "the engine")
    offload = e.oom.device.startswith("cuda")  # a CPU process has nowhere to offload to
    if e.engine == ZERO3:
        return (
            "The model or DeepSpeed's buffers did not fit at set-up: build the layers under deepspeed.zero.Init "
            "(Lightning: in configure_model())" + (", offload parameters or the optimizer to CPU" if offload else "")
            + ", or use more ranks."
        )
    if e.engine in FSDP_ENGINES:
        return (
            f"The model did not fit while {engine} set it up: build it on the meta device "
            '(`torch.device("meta")`) and let the engine allocate each rank\'s shards, '
            + ("offload, or run on more ranks." if offload else "or run on more ranks.")
        )
    return (
        "The model or the engine's buffers did not fit at set-up: shard the model (FSDP with an auto-wrap "
        "policy; ZeRO-3 with the layers built under deepspeed.zero.Init)" + (", or offload." if offload else ".")
    )


def _bucket_fix(e: OutOfMemory) -> str:
    bucket = (
        f" The request matches DeepSpeed's default reduce bucket (5e8 elements, {fmt(REDUCE_BUCKET_BYTES)} in fp32)."
        if e.oom.requested_bytes == REDUCE_BUCKET_BYTES
        else ""
    )
    return (
        "Communication buffers filled the memory: lower `reduce_bucket_size`, `allgather_bucket_size` and "
        "`stage3_prefetch_bucket_size` in `zero_optimization` (e.g. 5e7), or FSDP's bucket sizes." + bucket
    )


def _where_kind(kind: str) -> str:
    return {
        "workspace": "cuBLAS keeps one workspace per thread and stream that ran a matmul "
        "(`CUBLAS_WORKSPACE_CONFIG` sets their size).",
        "script": "the places that made them are listed with the memory split (`script_at`).",
        "other": "the places that made them are listed with the memory split.",
        "unexplained": "the allocator's places for it are listed with the memory split (`unexplained_at`).",
    }.get(kind, "see the memory split.")


def _mixed_fix(e: OutOfMemory) -> str:
    """No kind held half: name the two largest, with what reduces each."""
    held = sorted(held_at_oom(e).items(), key=lambda item: -item[1])[:2]
    parts = ", ".join(f"{KIND_WORDS.get(k, k)} {fmt(n)}" for k, n in held)
    return f"No one kind filled the memory at the OOM (largest: {parts}). " + _phase_fix(e)


def _phase_fix(e: OutOfMemory) -> str:
    """What usually fills the phase the OOM struck in."""
    o = e.oom
    step = o.engine_step or ""
    if step.endswith("_configure_zero_optimizer"):
        return (
            "DeepSpeed allocates ZeRO's communication buckets and fp32 optimizer partitions here: lower its bucket "
            "sizes in `zero_optimization` (e.g. 5e7), or offload the optimizer (`offload_optimizer: {device: cpu}`)."
        )
    if o.phase in ("forward", "backward", "validation"):
        return "In a " + o.phase + ": " + _activations_fix(e)[0].lower() + _activations_fix(e)[1:]
    if o.phase == "optimizer":
        return "At the optimizer step: " + _state_fix(e)
    if o.phase == "setup":
        return _setup_fix(e)
    return "Reduce what this phase allocates (batch size, buffers), or shard or offload more of the model."
