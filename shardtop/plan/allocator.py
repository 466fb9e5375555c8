"""What PyTorch's caching allocator must hold from the device for a known sequence of tensors.

An engine's set-up is a short, fixed sequence of large buffers, some of them
freed again before set-up ends.  A freed block is not given back to the
device: it stays in its segment, and the next request it can serve takes the
smallest such block and leaves the rest of it free (best fit, blocks split).
A request larger than every free block needs a new segment.  When the device
cannot give one, PyTorch returns the segments that hold nothing and tries
once more; a free block inside a segment that still holds a live tensor cannot
be returned.  So what a sequence needs at a request is every segment that
still holds something, plus the new one: more than the bytes alive whenever a
freed block was cut for a smaller request before a larger one came.

The rounding of sizes (512 bytes, 2 MiB segments) is left out of that replay: a
plan's ``cards.FRAGMENTATION`` allowance covers it.  Where a tensor the plan
knows by itself takes a segment of its own, ``new_segment_block`` says what
the allocator counts for it.  Torch-free and pure.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from shardtop.units import ceil_div

BLOCK_ROUNDING = 512
"""Every block is a multiple of 512 bytes (``kMinBlockSize``)."""
SMALL_REQUEST = 2**20
"""Requests up to 1 MiB come from 2 MiB segments (``kSmallSize``); a larger block is split only where more
than this would be left."""
PACKED_REQUEST = 10 * 2**20
"""Requests under 10 MiB come from 20 MiB segments (``kMinLargeAlloc``, ``kLargeBuffer``); larger ones get a
segment of their own size rounded up to 2 MiB (``kRoundLarge``)."""
SEGMENT_ROUNDING = 2 * 2**20


def new_segment_block(size: int) -> int:
    """The bytes PyTorch's CUDA caching allocator counts as allocated (``allocated_bytes``) for a request of
    ``size`` that it serves from a new segment: the request rounded up to 512 bytes, unless the segment is
    left whole because no more than 1 MiB of it would be left over (``should_split`` in
    ``c10/cuda/CUDACachingAllocator.cpp``).  A tensor of 27.04 MiB takes a 28 MiB segment and counts as
    28 MiB.  Expandable segments (``PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True``) always split, and
    are not modelled."""
    if size <= 0:
        return 0
    rounded = _rounded_up(size, BLOCK_ROUNDING)
    if size < PACKED_REQUEST:
        return rounded
    segment = _rounded_up(size, SEGMENT_ROUNDING)
    return segment if segment - rounded <= SMALL_REQUEST else rounded


def beyond_tensors(sizes: Iterable[int]) -> int:
    """What the allocator counts beyond tensors of ``sizes`` bytes, each served from a new segment."""
    return sum(new_segment_block(size) - size for size in sizes)


def _rounded_up(size: int, step: int) -> int:
    return ceil_div(size, step) * step


@dataclass(frozen=True)
class Alloc:
    """A tensor of ``size`` bytes, named for the user (``the fp32 master copy``)."""

    name: str
    size: int
    scattered: bool = False
    """Many small tensors, one per parameter: each in a block of its own, never large enough for a later
    request of the sequence, and returned to the device once freed."""


@dataclass(frozen=True)
class Free:
    name: str


@dataclass(frozen=True)
class EmptyCache:
    """``torch.cuda.empty_cache()``: the segments that hold nothing go back to the device."""


Step = Alloc | Free | EmptyCache


@dataclass(frozen=True)
class Need:
    """The worst moment of a sequence."""

    allocated: int
    """The most bytes alive at once."""
    held: int
    """The most the allocator must hold from the device at once: segments with a live block in them."""
    requests: tuple[tuple[str, int], ...]
    """Each request in order, with what the allocator must hold once it is served."""

    @property
    def at(self) -> str:
        """The request at which ``held`` is reached."""
        return next((name for name, held in self.requests if held == self.held), "")


@dataclass
class _Block:
    size: int
    owner: str | None
    """None: free."""


def need(steps: Sequence[Step]) -> Need:
    """Replay ``steps`` through a model of the caching allocator; see the module's docstring."""
    segments: list[list[_Block]] = []
    scattered: dict[str, int] = {}
    live = peak_live = 0
    requests: list[tuple[str, int]] = []
    for step in steps:
        if isinstance(step, EmptyCache):
            segments = [seg for seg in segments if any(b.owner is not None for b in seg)]
        elif isinstance(step, Free):
            live -= scattered.pop(step.name, 0) or _free(segments, step.name)
        elif step.size > 0:
            if step.scattered:
                scattered[step.name] = scattered.get(step.name, 0) + step.size
            else:
                _place(segments, step)
            live += step.size
            held = sum(scattered.values()) + sum(
                sum(b.size for b in seg) for seg in segments if any(b.owner is not None for b in seg))
            peak_live = max(peak_live, live)
            requests.append((step.name, held))
    return Need(allocated=peak_live, held=max((h for _, h in requests), default=0), requests=tuple(requests))


def _place(segments: list[list[_Block]], alloc: Alloc) -> None:
    """Best fit among the free blocks, the rest of the block left free; else a new segment."""
    fits = [(b.size, i, j) for i, seg in enumerate(segments) for j, b in enumerate(seg)
            if b.owner is None and b.size >= alloc.size]
    if not fits:
        segments.append([_Block(alloc.size, alloc.name)])
        return
    size, i, j = min(fits)
    segments[i][j] = _Block(alloc.size, alloc.name)
    if size > alloc.size:
        segments[i].insert(j + 1, _Block(size - alloc.size, None))


def _free(segments: list[list[_Block]], name: str) -> int:
    """Free the block ``name`` and merge it with free neighbours; its size (0 if there is none)."""
    for seg in segments:
        for b in seg:
            if b.owner == name:
                size = b.size
                b.owner = None
                merged: list[_Block] = []
                for block in seg:
                    if block.owner is None and merged and merged[-1].owner is None:
                        merged[-1] = _Block(merged[-1].size + block.size, None)
                    else:
                        merged.append(block)
                seg[:] = merged
                return size
    return 0
