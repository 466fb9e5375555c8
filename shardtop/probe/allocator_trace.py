"""The CUDA allocator's recorded history, read back into "what filled memory at its peak".

Pure functions over the dictionaries ``torch.cuda.memory._snapshot()``
returns (documented in ``torch/cuda/memory.py``): ``segments`` with their
``blocks`` (``address``, ``size``, ``state``, ``frames``) and
``device_traces``, one list of ``TraceEntry`` per device (``action``,
``addr``, ``size``, ``frames``).  Frames are innermost first.  Nothing here
imports torch, so it is tested on CPU with snapshots built by hand.

``timeline()`` replays a device's trace into blocks with lifetimes:
``allocated`` falls at ``free_requested`` (as the allocator's stat does; at
``free_completed`` only when a trace holds no ``free_requested``), blocks
freed without their allocation in the trace were allocated before it began,
and blocks alive at the snapshot without one too.  Its maximum is the peak
the trace saw, with the blocks alive then.

``split_blocks()`` says what each of those blocks was, in order:

1. a census (``memory_kinds.py``) taken while the block was alive saw a
   tensor's storage at its address: that tensor's kind;
2. else the code that allocated it (``kind_of_frames``), where it names a
   parameter, gradient, optimizer state or buffer: an optimizer's state
   initialisation, an engine's gather, bucket or gradient code, a module's
   construction or move;
3. else, a block of a library workspace's size (``workspaces``: cuBLAS's
   and cuBLASLt's, as the running torch sizes them) that lives to the end of
   the trace and was allocated before its first step ended: a workspace;
4. else, allocated in an earlier step than the moment split (not in set-up)
   and still alive, by code that makes no parameter, gradient, optimizer state
   or buffer: kept from earlier steps (``kept``);
5. else the code that allocated it: a module's forward (an activation,
   unless saved tensors were followed and this was not one of them), the
   optimizer's temporaries; or, allocated during a backward without a Python
   frame (autograd's engine made it on its own thread) or by the Python
   ``backward`` of an autograd Function (DeepSpeed ZeRO-3's linear): a
   temporary of the backward, such as an activation's gradient or a weight's
   on its way to the engine's buffer (other);
6. else it is ``unexplained``.

Censuses are tied to trace positions by markers: the probe allocates a tiny
tensor from ``MARKER_FUNCTION`` whenever it takes one, so the n-th marker
from the end of the trace is the n-th census from the end.
"""

from __future__ import annotations

import bisect
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from shardtop.rundir.events import AllocationSite, MemoryKinds, MemorySplit

KINDS = ("params", "grads", "optimizer", "comm", "other", "kept", "activations")
"""The kinds, in the order a census counts them: a storage held by two counts under the first
(a BatchNorm's running statistics are saved for backward, yet they are module buffers)."""

TRACE_KINDS = (*KINDS, "workspace")
"""The kinds of the trace's blocks: a census's, and the library workspaces only a block's size and
lifetime tell (no census sees them: no tensor stands behind them)."""

BLOCK = 512
"""The CUDA caching allocator rounds every block up to a multiple of 512 bytes."""

MARKER_FUNCTION = "_shardtop_trace_marker"
"""The probe's marker allocation is made from a function of this name."""

Frame = Mapping[str, Any]


def block_bytes(nbytes: int, cuda: bool) -> int:
    """What a storage of ``nbytes`` occupies: its block on CUDA, itself elsewhere."""
    if nbytes <= 0:
        return 0
    return -(-nbytes // BLOCK) * BLOCK if cuda else nbytes


# -- who allocated it ------------------------------------------------------------------


@dataclass(frozen=True)
class FrameRule:
    """Frames in a file whose path contains ``path`` (and, if given, named one of ``names``) mean ``kind``.

    ``grad_names``: within that file, a function whose name contains "grad" means gradients instead.
    """

    path: str
    kind: str
    names: frozenset[str] | None = None
    grad_names: bool = False

    def matches(self, filename: str, name: str) -> str | None:
        if self.path not in filename or (self.names is not None and name not in self.names):
            return None
        if self.grad_names and "grad" in name.lower():
            return "grads"
        return self.kind


FRAME_RULES: tuple[FrameRule, ...] = (
    FrameRule("torch/optim/", "optimizer", frozenset({"_init_group", "_init_state", "_lazy_init_state"})),
    FrameRule("torch/optim/", "other"),  # the step's temporaries (foreach intermediates)
    FrameRule("torch/distributed/fsdp/_flat_param.py", "params", grad_names=True),
    FrameRule("torch/distributed/fsdp/_fully_shard/_fsdp_param.py", "params", grad_names=True),
    FrameRule("torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py", "params",
              frozenset({"foreach_all_gather_copy_out", "_get_all_gather_input_metadatas"})),
    FrameRule("torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py", "comm"),
    FrameRule("torch/distributed/fsdp/_runtime_utils.py", "grads",
              frozenset({"_reduce_grad", "_reduce_grad_no_shard", "_post_backward_hook", "_accumulate_sharded_grad",
                         "_get_reduce_scatter_tensors", "_post_reduce_grad_callback", "_div_if_needed"})),
    FrameRule("torch/distributed/fsdp/_runtime_utils.py", "params", frozenset({"_unshard", "_pre_forward_unshard"})),
    FrameRule("torch/distributed/fsdp/", "params",
              frozenset({"_init_param_handle_from_module", "_move_module_to_device",
                         "_materialize_meta_module", "_init_param_handle_from_params"})),
    FrameRule("torch/nn/parallel/distributed.py", "comm", frozenset({"__init__", "_ddp_init_helper"})),
    FrameRule("deepspeed/runtime/zero/partition_parameters.py", "params"),
    FrameRule("deepspeed/runtime/zero/partitioned_param_coordinator.py", "params"),
    FrameRule("deepspeed/runtime/zero/stage3.py", "optimizer",
              frozenset({"_create_fp32_partitions", "initialize_optimizer_states", "_optimizer_step"})),
    FrameRule("deepspeed/runtime/zero/stage3.py", "params",
              frozenset({"_create_fp16_partitions_with_defragmentation"})),
    FrameRule("deepspeed/runtime/zero/stage3.py", "comm",
              frozenset({"_DeepSpeedZeroOptimizer_Stage3__reduce_and_partition_ipg_grads",
                         "__reduce_and_partition_ipg_grads", "allreduce_bucket", "average_tensor"})),
    FrameRule("deepspeed/runtime/zero/stage3.py", "grads", grad_names=True, names=None),
    FrameRule("deepspeed/runtime/zero/stage_1_and_2.py", "optimizer", frozenset({"initialize_optimizer_states"})),
    FrameRule("deepspeed/runtime/zero/stage_1_and_2.py", "comm",
              frozenset({"average_tensor", "reduce_ipg_grads", "allreduce_bucket", "allreduce_and_copy",
                         "gradient_reduction_w_predivide", "allreduce_no_retain", "buffered_reduce_fallback"})),
    FrameRule("deepspeed/runtime/zero/stage_1_and_2.py", "grads", grad_names=True, names=None),
    FrameRule("deepspeed/runtime/bf16_optimizer.py", "grads", grad_names=True, names=None),
    FrameRule("torch/nn/modules/module.py", "params", frozenset({"_apply", "to", "cuda", "to_empty", "_to_empty",
                                                                 "half", "float", "bfloat16", "type"})),
    FrameRule("torch/nn/init.py", "params"),
    FrameRule("torch/utils/checkpoint.py", "activations"),
)
"""Matched against each frame, innermost first; the first frame any rule matches decides.
A frame in an engine's file that no rule names falls through to the frames outside it."""

_MODULE_INIT = ("__init__", "reset_parameters")


def kind_of_frames(frames: Sequence[Frame], forward: str = "activations") -> str | None:
    """The kind the allocating code says, or None.

    Besides ``FRAME_RULES``: a module's constructor (``__init__`` or
    ``reset_parameters`` of a ``torch/nn/modules`` class) makes parameters,
    and a ``forward`` anywhere else (the user's or torch's modules) makes
    ``forward``: by default activations (a forward's block still alive later
    is a tensor saved for backward, or the output on its way there); "other"
    where the saved tensors were followed, so that whatever a census did not
    see as saved was not.
    """
    for frame in frames:
        filename = str(frame.get("filename", "")).replace("\\", "/")
        name = str(frame.get("name", ""))
        if name == MARKER_FUNCTION:
            return None
        for rule in FRAME_RULES:
            kind = rule.matches(filename, name)
            if kind is not None:
                return kind
        if name in _MODULE_INIT and "torch/nn/modules/" in filename:
            return "params"
        if name == "forward" and not _in_engine(filename):
            return forward
    return None


_ENGINE_PATHS = ("torch/distributed/", "torch/nn/parallel/", "deepspeed/", "lightning/")


def _in_engine(filename: str) -> bool:
    return any(path in filename for path in _ENGINE_PATHS)


def is_marker(frames: Sequence[Frame]) -> bool:
    return any(frame.get("name") == MARKER_FUNCTION for frame in frames[:3])


# -- the trace replayed --------------------------------------------------------------------


@dataclass(frozen=True)
class TracedBlock:
    """One allocation and its lifetime in trace positions."""

    address: int
    size: int
    frames: Sequence[Frame]
    start: int
    """Position of its ``alloc``; -1 if allocated before the trace began."""
    end: int
    """Position of its free; the trace's length if still allocated at the snapshot."""

    def alive_at(self, position: int) -> bool:
        return self.start <= position < self.end


@dataclass(frozen=True)
class Timeline:
    """A device's trace as blocks with lifetimes, and the highest ``allocated`` it reached."""

    blocks: list[TracedBlock]
    markers: list[int]
    """Positions of the probe's marker allocations, in order."""
    length: int
    peak: int
    """The highest allocated bytes (marker blocks excluded)."""
    peak_position: int
    """Position after which ``peak`` held; -1 if the peak was before the trace's first entry."""

    def alive_at(self, position: int) -> list[TracedBlock]:
        return [b for b in self.blocks if b.alive_at(position)]


def live_blocks(
    segments: Iterable[Mapping[str, Any]], device: int | None = None
) -> list[tuple[int, int, Sequence[Frame]]]:
    """(address, size, frames) of every allocated block in a snapshot's segments (of ``device``)."""
    out: list[tuple[int, int, Sequence[Frame]]] = []
    for segment in segments:
        if device is not None and segment.get("device", device) != device:
            continue
        for block in segment.get("blocks", ()):
            if block.get("state") == "active_allocated":
                out.append((int(block["address"]), int(block["size"]), block.get("frames") or ()))
    return out


def largest_free_block(segments: Iterable[Mapping[str, Any]], device: int | None = None) -> int:
    """The largest block the allocator could hand out without asking CUDA for more."""
    sizes = [
        int(block["size"])
        for segment in segments
        if device is None or segment.get("device", device) == device
        for block in segment.get("blocks", ())
        if block.get("state") == "inactive"
    ]
    return max(sizes, default=0)


def timeline(trace: Sequence[Mapping[str, Any]], live: Iterable[tuple[int, int, Sequence[Frame]]]) -> Timeline:
    """Replay ``trace`` (one device's entries) ending in the ``live`` blocks of the snapshot."""
    frees = ("free_requested",) if any(e.get("action") == "free_requested" for e in trace) else ("free_completed",)
    open_blocks: dict[int, tuple[int, int, Sequence[Frame]]] = {}
    blocks: list[TracedBlock] = []
    markers: list[int] = []
    marker_addresses: set[int] = set()
    for position, entry in enumerate(trace):
        action = entry.get("action")
        if action == "alloc":
            frames = entry.get("frames") or ()
            address = int(entry["addr"])
            if is_marker(frames):
                markers.append(position)
                marker_addresses.add(address)
                continue
            open_blocks[address] = (int(entry["size"]), position, frames)
        elif action in frees:
            address = int(entry["addr"])
            if address in marker_addresses:
                marker_addresses.discard(address)
                continue
            opened = open_blocks.pop(address, None)
            if opened is None:  # allocated before the trace began
                blocks.append(TracedBlock(address, int(entry["size"]), (), -1, position))
            else:
                size, start, frames = opened
                blocks.append(TracedBlock(address, size, frames, start, position))
    length = len(trace)
    for address, size, frames in live:
        opened = open_blocks.pop(address, None)
        if opened is not None:
            blocks.append(TracedBlock(address, opened[0], opened[2] or frames, opened[1], length))
        else:
            blocks.append(TracedBlock(address, size, frames, -1, length))
    # Blocks the trace opened but the snapshot no longer lists were freed unrecorded: close at the end.
    blocks.extend(TracedBlock(a, s, f, p, length) for a, (s, p, f) in open_blocks.items())
    peak, position = _peak(blocks, length)
    return Timeline(blocks, markers, length, peak, position)


def _peak(blocks: Sequence[TracedBlock], length: int) -> tuple[int, int]:
    delta = [0] * (length + 1)
    current = 0
    for block in blocks:
        if block.start < 0:
            current += block.size
        else:
            delta[block.start] += block.size
        if block.end < length:
            delta[block.end] -= block.size
    best, best_position = current, -1
    for position in range(length):
        current += delta[position]
        if current > best:
            best, best_position = current, position
    return best, best_position


# -- what each block was ----------------------------------------------------------------------


@dataclass(frozen=True)
class Census:
    """The storages a census saw (address -> kind) at a trace position."""

    position: int
    addresses: Mapping[int, str]


SITES = 3
"""How many places of allocation a split names for its unexplained bytes."""


@dataclass
class BlockSplit:
    """Bytes per kind of some blocks, and the bytes of those no source named."""

    kinds: dict[str, int] = field(default_factory=lambda: dict.fromkeys(TRACE_KINDS, 0))
    unexplained: int = 0
    total: int = 0
    unexplained_by_site: dict[str, int] = field(default_factory=dict)

    def add(self, kind: str | None, size: int, frames: Sequence[Frame] = ()) -> None:
        self.total += size
        if kind is None:
            self.unexplained += size
            where = site_of(frames)
            self.unexplained_by_site[where] = self.unexplained_by_site.get(where, 0) + size
        else:
            self.kinds[kind] += size

    def memory_kinds(self) -> MemoryKinds:
        return MemoryKinds(**self.kinds)

    def largest_unexplained(self, count: int = SITES) -> list[AllocationSite]:
        ranked = sorted(self.unexplained_by_site.items(), key=lambda item: (-item[1], item[0]))
        return [AllocationSite(where=where, bytes=size) for where, size in ranked[:count]]


_IMPORT_ROOTS = tuple(sorted({p.replace("\\", "/").rstrip("/") + "/" for p in sys.path if p and p != "."},
                             key=len, reverse=True))
"""Where this process imports from: a frame's path is shown from below the longest of them."""


def site_of(frames: Sequence[Frame]) -> str:
    """``path:line in function`` of the innermost frame outside torch's own Python (the innermost of all
    when every frame is torch's); ``""`` for none.  A path under ``site-packages`` (or another folder this
    process imports from) is shown from there on, any other by its file name."""
    if not frames:
        return ""
    frame = next((f for f in frames if not _in_torch(str(f.get("filename", "")))), frames[0])
    path = str(frame.get("filename", "")).replace("\\", "/")
    root = next((r for r in _IMPORT_ROOTS if path.startswith(r)), None)
    if root is not None:
        path = path[len(root):]
    elif "-packages/" in path:
        path = path.rsplit("-packages/", 1)[1]
    else:
        path = path.rsplit("/", 1)[-1]
    return f"{path}:{frame.get('line', '?')} in {frame.get('name', '?')}"


def _in_torch(filename: str) -> bool:
    path = filename.replace("\\", "/")
    return "/torch/" in path or path.startswith("torch/")


HELD_KINDS = frozenset({"params", "grads", "optimizer", "comm"})
"""What a block from an earlier step may be and still not be kept: the model's own state."""


def split_blocks(
    blocks: Iterable[TracedBlock],
    position: int,
    censuses: Sequence[Census],
    phase_at: Callable[[int], str] | None = None,
    step_at: Callable[[int], int | None] | None = None,
    workspaces: frozenset[int] = frozenset(),
    end: int | None = None,
) -> BlockSplit:
    """Classify the blocks alive at ``position`` (see the module docstring).

    ``phase_at`` and ``step_at`` (a trace position's phase and step, from the
    markers) name two more kinds of block: one allocated during a backward
    without a Python frame was made by autograd's engine on its own thread, and
    if no census saw it as a gradient it is a temporary of the backward
    (other); one allocated in an earlier step is kept from it.
    ``workspaces``: the block sizes of the libraries' workspaces; ``end``: the
    trace's length (a block alive there was never freed).
    """
    ordered = sorted(censuses, key=lambda c: abs(c.position - position))
    followed = any("activations" in census.addresses.values() for census in censuses)
    forward = "other" if followed else "activations"
    now = step_at(position) if step_at is not None else None
    first = _first_training_step(censuses, phase_at, step_at)
    split = BlockSplit()
    for block in blocks:
        if not block.alive_at(position):
            continue
        kind = None
        for census in ordered:
            if block.alive_at(census.position):
                kind = census.addresses.get(block.address)
                if kind is not None:
                    break
        if kind is None or kind == "activations":
            kind = _uncounted_kind(block, kind, forward, phase_at, step_at, now, first, workspaces, end)
        split.add(kind, block.size, block.frames)
    return split


def _first_training_step(
    censuses: Sequence[Census],
    phase_at: Callable[[int], str] | None,
    step_at: Callable[[int], int | None] | None,
) -> int | None:
    """The step of the first census taken in training, not in set-up."""
    if step_at is None:
        return None
    training = [c for c in censuses if phase_at is None or phase_at(c.position) not in ("setup", "")]
    return min((s for c in training if (s := step_at(c.position)) is not None), default=None)


def _uncounted_kind(
    block: TracedBlock,
    census_kind: str | None,
    forward: str,
    phase_at: Callable[[int], str] | None,
    step_at: Callable[[int], int | None] | None,
    now: int | None,
    first: int | None,
    workspaces: frozenset[int],
    end: int | None,
) -> str | None:
    """The kind of a block no census named as the model's state (rules 3 to 6 of the module docstring)."""
    made_step = step_at(block.start) if step_at is not None and block.start >= 0 else None
    earlier = (
        made_step is not None and now is not None and made_step < now
        and phase_at is not None and phase_at(block.start) not in ("setup", "")
    )
    if census_kind is not None:  # a saved tensor: of this step's forward, or kept with an earlier step's graph
        return "kept" if earlier else census_kind
    if (
        block.size in workspaces
        and end is not None
        and block.end >= end
        and (block.start < 0 or made_step is None or first is None or made_step <= first)
    ):
        return "workspace"
    framed = kind_of_frames(block.frames, forward)
    if framed in HELD_KINDS:
        return framed
    if earlier:
        return "kept"
    if framed is not None:
        return framed
    in_backward = block.start >= 0 and phase_at is not None and phase_at(block.start) == "backward"
    if in_backward and _backward_made(block.frames):
        return "other"
    return None


def _backward_made(frames: Sequence[Frame]) -> bool:
    """Made by the backward itself: autograd's engine on its own thread (no Python frame), or the Python
    ``backward`` of an autograd Function outside torch (DeepSpeed ZeRO-3's linear, a user's own)."""
    if not frames:
        return True
    inner = next((f for f in frames if not _in_torch(str(f.get("filename", "")))), None)
    return inner is not None and inner.get("name") == "backward"


def align_censuses(markers: Sequence[int], censuses: Sequence[Mapping[int, str]]) -> list[Census]:
    """Censuses paired with the marker positions, from the end: the trace may have lost its oldest markers."""
    pairs = zip(reversed(markers), reversed(censuses), strict=False)
    return [Census(position, addresses) for position, addresses in pairs]


def peak_split(
    snapshot: Mapping[str, Any],
    device: int,
    censuses: Sequence[Mapping[int, str]],
    labels: Sequence[tuple[str, int]] = (),
    workspaces: frozenset[int] = frozenset(),
) -> tuple[MemorySplit, Timeline] | None:
    """The split at the peak a snapshot's trace recorded for ``device``; None without a trace.

    ``censuses`` and ``labels`` (phase, step) are one per marker the probe
    placed, oldest first; the phase of the peak is the label of the last
    marker before it.  ``workspaces``: the libraries' workspace block sizes.
    """
    traces = snapshot.get("device_traces") or []
    if device >= len(traces) or not traces[device]:
        return None
    line = timeline(traces[device], live_blocks(snapshot.get("segments", ()), device))
    offset = len(labels) - len(line.markers)

    def label_at(position: int) -> tuple[str, int | None]:
        """The label of the last marker at or before ``position``: the phase running there."""
        index = bisect.bisect_right(line.markers, position) - 1 + offset
        return labels[index] if index >= offset and 0 <= index < len(labels) else ("", None)

    split = split_blocks(line.blocks, line.peak_position, align_censuses(line.markers, censuses),
                         lambda position: label_at(position)[0], lambda position: label_at(position)[1],
                         workspaces, line.length)
    phase, step = label_at(line.peak_position)
    result = MemorySplit(
        allocated=line.peak,
        by_kind=split.memory_kinds(),
        unexplained=line.peak - sum(split.kinds.values()),
        source="allocator-trace",
        phase=phase,
        step=step,
        unexplained_at=split.largest_unexplained(),
    )
    return result, line


def current_split(snapshot: Mapping[str, Any], device: int, census: Mapping[int, str]) -> BlockSplit:
    """The blocks allocated at the snapshot, classified by a census taken now and their frames.

    No workspace is named here: a block's size alone does not tell a workspace from a tensor of the
    same size (an MLP's 4 x 512 x 4096 float32 activation is 32 MiB too); only a trace's lifetimes do.
    """
    blocks = [TracedBlock(a, s, f, -1, 1) for a, s, f in live_blocks(snapshot.get("segments", ()), device)]
    return split_blocks(blocks, 0, [Census(0, census)])
