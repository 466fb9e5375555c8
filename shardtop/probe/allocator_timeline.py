"""The CUDA allocator's recorded history replayed: blocks with lifetimes, and the peak they reached.

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
the trace saw, with the blocks alive then.  What each block was is
``allocator_trace.py``'s.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from shardtop.probe.allocating_code import Frame, is_marker
from shardtop.units import ceil_div

BLOCK = 512
"""The CUDA caching allocator rounds every block up to a multiple of 512 bytes."""


def block_bytes(nbytes: int, cuda: bool) -> int:
    """What a storage of ``nbytes`` occupies: its block on CUDA, itself elsewhere."""
    if nbytes <= 0:
        return 0
    return ceil_div(nbytes, BLOCK) * BLOCK if cuda else nbytes


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
