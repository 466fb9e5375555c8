"""What filled memory at the CUDA allocator's peak: each block of its replayed trace, by kind.

The trace is replayed into blocks with lifetimes by ``allocator_timeline.py``.
Nothing here imports torch, so it is tested on CPU with snapshots built by hand.

``split_blocks()`` says what each of those blocks was, in order:

1. a census (``memory_kinds.py``) taken while the block was alive saw a
   tensor's storage at its address: that tensor's kind (the model's output
   and what the loss made of it: ``other``, parts ``output`` and ``loss``);
2. else the code that allocated it (``allocating_code.kind_of_frames``), where it names a
   parameter, gradient, optimizer state or buffer: an optimizer's state
   initialisation, an engine's gather, bucket or gradient code, a module's
   construction or move;
3. else, a block of a library workspace's size (``workspaces``: cuBLAS's
   and cuBLASLt's, as the running torch sizes them) that lives to the end of
   the trace and was allocated before its first step ended: a workspace,
   unless more than ``MAX_WORKSPACE_BLOCKS`` blocks of that size live to the end;
4. else, allocated in an earlier step than the moment split (not in set-up)
   and still alive, by code that makes no parameter, gradient, optimizer state
   or buffer: kept from earlier steps (``kept``); so is a block a module's
   forward made during an earlier forward of the same step (an evaluation
   loop's, generation's: ``forward_at``) that no census saw saved for backward;
5. else the code that allocated it: outside a backward, a loss function
   (``allocating_code.loss_made``: ``F.cross_entropy``, a loss module,
   transformers' losses, a softmax no module called), what the loss made of
   the model's output (``other``, part ``loss``; a copy the script made itself,
   ``logits.float()``, is told only by a census); a module's forward (an activation,
   unless saved tensors were followed and this was not one of them), the
   optimizer's temporaries; or, allocated during a backward without a Python
   frame (autograd's engine made it on its own thread; in a forward's label
   too, where the loss's backward runs before the model's first backward
   hook marks the phase) or by the Python
   ``backward`` of an autograd Function (DeepSpeed ZeRO-3's linear): a
   temporary of the backward, such as an activation's gradient or a weight's
   on its way to the engine's buffer (other);
6. else, allocated outside a backward by the training script's own code
   (``allocating_code.script_made``: its inputs, its own buffers): made by the
   script (``script``), with the place;
7. else it is ``unexplained``.

The split's phase is the label of the last marker before the peak, but a
"forward" with a block of the backward's own (rule 5) made since that marker
is the backward (the loss's, before the model's first backward hook marks it).

Censuses are tied to trace positions by markers: the probe allocates a tiny
tensor from ``MARKER_FUNCTION`` whenever it takes one, so the n-th marker
from the end of the trace is the n-th census from the end.
"""

from __future__ import annotations

import bisect
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from shardtop.probe.allocating_code import Frame, backward_made, kind_of_frames, loss_made, script_made, site_of
from shardtop.probe.allocator_timeline import Timeline, TracedBlock, live_blocks, timeline
from shardtop.rundir.memory_figures import (
    OTHER_PARTS,
    AllocationSite,
    MemoryKinds,
    MemorySplit,
    OtherPart,
    OtherParts,
)

KINDS = ("params", "grads", "optimizer", "comm", "other", "kept", "activations")
"""The kinds, in the order a census counts them: a storage held by two counts under the first
(a BatchNorm's running statistics are saved for backward, yet they are module buffers)."""

OUTPUT = "output"
"""A census's name for the model's output (the latest forward's outermost call returned it): counted last,
under ``other`` (``OtherParts.output``), unless an earlier step or forward made it (kept)."""
LOSS = "loss"
"""A census's name for what the loss made of the model's output (``activations.py``), counted after it, and
the name of a block a loss function's code allocated outside a backward (``allocating_code.loss_made``):
under ``other`` (``OtherParts.loss``), unless an earlier step or forward made it (kept)."""

MAX_WORKSPACE_BLOCKS = 8
"""More blocks of one workspace size than this alive at the trace's end are a model's tensors of that
size (a 512 × 512 float32 weight is 1 MiB, as cuBLASLt's workspace is), not workspaces: a library keeps
one per handle and stream."""
TRACE_KINDS = (*KINDS, "workspace", "script")
"""The kinds of the trace's blocks: a census's, the library workspaces only a block's size and
lifetime tell (no census sees them: no tensor stands behind them), and what the script made, which
only a block's frames tell."""

# -- what each block was ----------------------------------------------------------------------


@dataclass(frozen=True)
class Census:
    """The storages a census saw (address -> kind) at a trace position."""

    position: int
    addresses: Mapping[int, str]


SITES = 3
"""How many places of allocation a split names for its unexplained bytes, the script's and the kept ones."""

SITED = ("unexplained", "script", "kept", "other")
"""What a split keeps the places of allocation of: the bytes no source named, the script's own tensors, and
those kept from earlier steps (a list of logits, a hook's stored activations), which a user finds by their
line."""


@dataclass
class BlockSplit:
    """Bytes per kind of some blocks, and the bytes of those no source named; where the blocks of ``SITED``
    were allocated; what made the blocks of ``other`` (``OtherParts``)."""

    kinds: dict[str, int] = field(default_factory=lambda: dict.fromkeys(TRACE_KINDS, 0))
    unexplained: int = 0
    total: int = 0
    by_site: dict[str, dict[tuple[OtherPart | None, str], int]] = field(
        default_factory=lambda: {what: {} for what in SITED}
    )
    other_parts: dict[OtherPart, int] = field(default_factory=lambda: dict.fromkeys(OTHER_PARTS, 0))
    backward_made_at: int = -1
    """The latest trace position at which a block of the backward's own (part ``backward``) was made."""

    def add(self, kind: str | None, size: int, frames: Sequence[Frame] = (), part: OtherPart | None = None) -> None:
        self.total += size
        if kind is None:
            self.unexplained += size
        else:
            self.kinds[kind] += size
        if kind == "other" and part is not None:
            self.other_parts[part] += size
        sites = self.by_site.get(kind or "unexplained")
        if sites is not None:
            key = (part if kind == "other" else None, site_of(frames))
            sites[key] = sites.get(key, 0) + size

    def memory_kinds(self) -> MemoryKinds:
        return MemoryKinds(**self.kinds)

    def parts(self) -> OtherParts:
        """What made the blocks of ``other``."""
        return OtherParts(**self.other_parts)

    def largest(self, what: str, count: int = SITES) -> list[AllocationSite]:
        """Where the most bytes of ``what`` (one of ``SITED``) were allocated, largest first."""
        ranked = sorted(self.by_site[what].items(), key=lambda item: (-item[1], item[0][1], item[0][0] or ""))
        return [AllocationSite(where=where, bytes=size, part=part) for (part, where), size in ranked[:count]]


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
    forward_at: Callable[[int], int] | None = None,
) -> BlockSplit:
    """Classify the blocks alive at ``position`` (see the module docstring).

    ``phase_at`` and ``step_at`` (a trace position's phase and step, from the
    markers) name two more kinds of block: one allocated during a backward
    without a Python frame was made by autograd's engine on its own thread, and
    if no census saw it as a gradient it is a temporary of the backward
    (other); one allocated in an earlier step is kept from it.
    ``workspaces``: the block sizes of the libraries' workspaces; ``end``: the
    trace's length (a block alive there was never freed); ``forward_at``: how many forwards had begun
    by a trace position (markers labelled ``forward``).
    """
    blocks = tuple(blocks)
    ordered = sorted(censuses, key=lambda c: abs(c.position - position))
    if end is not None and workspaces:
        lasting = Counter(b.size for b in blocks if b.size in workspaces and b.end >= end)
        workspaces = frozenset(s for s in workspaces if lasting[s] <= MAX_WORKSPACE_BLOCKS)
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
        census_kind = kind
        if kind is None or kind in ("activations", OUTPUT, LOSS):
            kind = _uncounted_kind(block, kind, forward, phase_at, step_at, now, first, workspaces, end)
            if kind in (forward, OUTPUT, LOSS) and _of_an_earlier_forward(block, position, phase_at, forward_at):
                kind = "kept"
        part: OtherPart | None = None
        if kind in (OUTPUT, LOSS):
            kind, part = "other", "output" if kind == OUTPUT else "loss"
        elif kind == "other":
            part = _other_part(census_kind, block.frames)
        split.add(kind, block.size, block.frames, part)
        if part == "backward":
            split.backward_made_at = max(split.backward_made_at, block.start)
    return split


def _other_part(census_kind: str | None, frames: Sequence[Frame]) -> OtherPart:
    """What made a block of ``other`` (the model's output and the loss's are told before): the census's
    buffers, else what its frames say (a forward's, the optimizer step's), else the backward (rule 5: the
    one way left to ``other``)."""
    if census_kind == "other":
        return "buffers"
    framed = kind_of_frames(frames, forward="forward")
    if framed == "forward":
        return "forward"
    if framed == "other":
        return "optimizer"
    return "backward"


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
    """The kind of a block no census named as the model's state (rules 3 to 7 of the module docstring)."""
    made_step = step_at(block.start) if step_at is not None and block.start >= 0 else None
    earlier = (
        made_step is not None and now is not None and made_step < now
        and phase_at is not None and phase_at(block.start) not in ("setup", "")
    )
    if census_kind is not None:  # a saved tensor: of this step's forward, or kept with an earlier step's graph
        return "kept" if earlier else census_kind
    framed = kind_of_frames(block.frames, forward)
    if framed in HELD_KINDS:
        return framed
    if (
        block.size in workspaces
        and end is not None
        and block.end >= end
        and (block.start < 0 or made_step is None or first is None or made_step <= first)
    ):
        return "workspace"
    if earlier:
        return "kept"
    phase = phase_at(block.start) if block.start >= 0 and phase_at is not None else ""
    if phase != "backward" and block.frames and loss_made(block.frames):
        return LOSS
    if framed is not None:
        return framed
    # a backward begins before the model's modules mark it: what the script computed after the model (the
    # loss) is differentiated first, on autograd's thread, with no Python frame
    in_backward = phase == "backward" or (phase == "forward" and not block.frames)
    if in_backward:  # the backward's own, or autograd's called from the script: not the script's tensors
        return "other" if backward_made(block.frames) else None
    if script_made(block.frames):
        return "script"
    return None


def _of_an_earlier_forward(
    block: TracedBlock, position: int, phase_at: Callable[[int], str] | None, forward_at: Callable[[int], int] | None
) -> bool:
    """Made in a forward before the one running at ``position``: not this forward's work, and kept by
    whatever still holds it (a list of outputs)."""
    if forward_at is None or phase_at is None or block.start < 0 or phase_at(block.start) != "forward":
        return False
    made = forward_at(block.start)
    return made >= 1 and made < forward_at(position)


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
    found = traced_splits(snapshot, device, censuses, labels, workspaces)
    return (found.peak, found.line) if found is not None else None


@dataclass(frozen=True)
class TracedSplits:
    """What a trace says at its peak and at its end."""

    peak: MemorySplit
    at_end: BlockSplit
    """The blocks alive when the snapshot was taken (at an OOM: what held the memory then)."""
    line: Timeline


def traced_splits(
    snapshot: Mapping[str, Any],
    device: int,
    censuses: Sequence[Mapping[int, str]],
    labels: Sequence[tuple[str, int]] = (),
    workspaces: frozenset[int] = frozenset(),
    now: Mapping[int, str] | None = None,
) -> TracedSplits | None:
    """``peak_split``'s split, and the split of the blocks alive at the trace's end, from one reading.

    ``now``: a census taken at the snapshot with no marker of its own (at an OOM, where a marker's
    allocation could fail): it sees the blocks alive at the trace's end.  Unlike ``current_split``,
    the trace's lifetimes name the libraries' workspaces there.
    """
    traces = snapshot.get("device_traces") or []
    if device >= len(traces) or not traces[device]:
        return None
    line = timeline(traces[device], live_blocks(snapshot.get("segments", ()), device))
    offset = len(labels) - len(line.markers)
    aligned = align_censuses(line.markers, censuses)
    if now is not None:
        aligned.append(Census(line.length - 1, now))

    def label_at(position: int) -> tuple[str, int | None]:
        """The label of the last marker at or before ``position``: the phase running there."""
        index = bisect.bisect_right(line.markers, position) - 1 + offset
        return labels[index] if index >= offset and 0 <= index < len(labels) else ("", None)

    forwards = [0]  # forwards begun by each marker, oldest first
    for index in range(offset, offset + len(line.markers)):
        forwards.append(forwards[-1] + (0 <= index < len(labels) and labels[index][0] == "forward"))

    def forward_at(position: int) -> int:
        """How many forwards had begun by ``position`` (of those whose markers the trace kept)."""
        index = bisect.bisect_right(line.markers, position)
        return forwards[min(index, len(forwards) - 1)]

    def split_at(position: int) -> BlockSplit:
        return split_blocks(line.blocks, position, aligned, lambda at: label_at(at)[0], lambda at: label_at(at)[1],
                            workspaces, line.length, forward_at)

    split = split_at(line.peak_position)
    phase, step = label_at(line.peak_position)
    if phase == "forward" and _backward_began(line, split, line.peak_position):
        phase = "backward"
    peak = MemorySplit(
        allocated=line.peak,
        by_kind=split.memory_kinds(),
        unexplained=line.peak - sum(split.kinds.values()),
        source="allocator-trace",
        phase=phase,
        step=step,
        unexplained_at=split.largest("unexplained"),
        script_at=split.largest("script"),
        kept_at=split.largest("kept"),
        other_at=split.largest("other"),
        other_parts=split.parts(),
    )
    return TracedSplits(peak, split_at(line.length - 1), line)


def _backward_began(line: Timeline, split: BlockSplit, position: int) -> bool:
    """A block of the backward's own (``OtherParts.backward``) alive at ``position`` was made since the last
    marker: a backward runs there, though no marker says so yet (the loss's backward, before the model's
    first backward hook marks the phase)."""
    index = bisect.bisect_right(line.markers, position) - 1
    since = line.markers[index] if index >= 0 else -1
    return split.backward_made_at > since


def current_split(snapshot: Mapping[str, Any], device: int, census: Mapping[int, str]) -> BlockSplit:
    """The blocks allocated at the snapshot, classified by a census taken now and their frames.

    No workspace is named here: a block's size alone does not tell a workspace from a tensor of the
    same size (an MLP's 4 x 512 x 4096 float32 activation is 32 MiB too); only a trace's lifetimes do.
    """
    blocks = [TracedBlock(a, s, f, -1, 1) for a, s, f in live_blocks(snapshot.get("segments", ()), device)]
    return split_blocks(blocks, 0, [Census(0, census)])
