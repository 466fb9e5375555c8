"""A rank's memory as one stacked bar: what fills it, kind by kind, with its peak marked.

The kinds come from the read model (``RankFacts.memory_now``: parameters,
gradients, optimizer state, activations, communication buffers, other, then
what no source explains), followed by the allocator's cache (reserved minus
allocated) and the device memory the process holds outside PyTorch.  Each
gets whole cells in proportion to its bytes; a kind too small for half a cell
is not dropped but drawn with the other small ones in one ``▪`` run, so a
glance never misses that something is there.  The peak is a ``│`` in the cell
it falls in.

Pure: no Textual, so the arithmetic is unit-tested on its own; the widget
(``RankMemory``) only styles the runs.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from rich.cells import cell_len

from shardtop.read.memory_kinds import KIND_SHORT, TRACE_SHARE, measured
from shardtop.rundir.memory_figures import MemorySplit
from shardtop.tui.format import BAR_EMPTY, BAR_FULL, BAR_RESERVED
from shardtop.units import short_bytes

CACHE = "cache"
"""The allocator's cache: reserved but not allocated."""
OUTSIDE = "outside"
"""Device memory of the process outside PyTorch's allocator (CUDA context, NCCL, cuBLAS)."""
SMALL = "small"
"""The run that holds the kinds too small for a cell of their own."""
FREE = "free"

GLYPHS: dict[str, str] = {"unexplained": "╳", CACHE: BAR_RESERVED, OUTSIDE: "▚", SMALL: "▪", FREE: BAR_EMPTY}
"""What each part is drawn with besides colour (every kind a source measured: █), so the bar reads
without colour: measured █, unexplained ╳ (not ▓: the launch prompt's plan bar draws gradients with it),
cache ▒, outside PyTorch ▚, small kinds ▪, free ░."""
SHORT: dict[str, str] = {**KIND_SHORT, "unexplained": "unexpl", CACHE: "cache", OUTSIDE: "outside"}
"""The legend's word for each part."""
PEAK = "│"
"""The peak's mark, drawn in the cell where the peak falls."""
ZOOM_FROM = 4
"""Bars are magnified when every rank uses under a quarter of what it may use."""


def glyph(name: str) -> str:
    return GLYPHS.get(name, BAR_FULL)


@dataclass(frozen=True, slots=True)
class BarPart:
    """Bytes of one part of the bar: a kind, ``unexplained``, ``cache`` or ``outside``."""

    name: str
    bytes: int


@dataclass(frozen=True, slots=True)
class BarRun:
    """Cells drawn for one part, or for several small parts (``name`` ``small``: their names in ``holds``)."""

    name: str
    cells: int
    holds: tuple[str, ...] = ()


def bar_parts(split: MemorySplit | None, cache: int | None, outside: int | None) -> tuple[BarPart, ...]:
    """The parts in the order they stack: the kinds a source measured, what none explains, the cache,
    memory outside PyTorch; parts under a thousandth of them all are rounding, not memory, and left
    out (as ``split_sentence`` leaves them out).  Empty without a split (the bar is drawn as
    allocated/reserved then)."""
    if split is None:
        return ()
    parts = [BarPart(r.kind, r.bytes) for r in measured(split) if r.bytes > 0]
    parts += [BarPart(name, b) for name, b in ((CACHE, cache), (OUTSIDE, outside)) if b]
    total = sum(p.bytes for p in parts)
    return tuple(p for p in parts if p.bytes * TRACE_SHARE >= total)


def stacked_runs(parts: Sequence[BarPart], scale: int, width: int) -> tuple[BarRun, ...]:
    """The runs of a ``width``-cell bar measuring ``scale`` bytes, ending with the ``free`` run.

    The filled cells are the parts' sum rounded (at least one); each part gets a share of them by
    largest remainder, at least one cell.  Parts under half a cell, and the smallest ones when
    there are more parts than cells, share one ``small`` run where the first of them stacks.
    """
    if width <= 0:
        return ()
    total = sum(p.bytes for p in parts)
    if total <= 0 or scale <= 0:
        return (BarRun(FREE, width),)
    filled = min(width, max(1, round(total / scale * width)))
    cell = total / filled  # bytes per filled cell, so the runs always sum to ``filled``
    by_size = sorted(parts, key=lambda p: -p.bytes)
    own = [p for p in by_size if p.bytes >= cell / 2]
    small = [p for p in by_size if p.bytes < cell / 2]
    room = filled - (1 if small else 0)
    if len(own) > room:
        keep = max(0, filled - 1)
        own, small = own[:keep], own[keep:] + small
    groups: list[tuple[str, int, tuple[str, ...]]] = [(p.name, p.bytes, ()) for p in own]
    if small:
        groups.append((SMALL, sum(p.bytes for p in small), tuple(p.name for p in parts if p in small)))
    cells = _shares([b for _, b, _ in groups], filled)
    made = {
        name if name != SMALL else holds[0]: BarRun(name, n, holds)
        for (name, _, holds), n in zip(groups, cells, strict=True)
    }
    runs = [made[p.name] for p in parts if p.name in made]
    return (*runs, BarRun(FREE, width - filled)) if filled < width else tuple(runs)


def _shares(sizes: Sequence[int], cells: int) -> list[int]:
    """``cells`` split in proportion to ``sizes`` by largest remainder, each at least one (len(sizes) <= cells)."""
    total = sum(sizes)
    ideal = [s / total * cells for s in sizes]
    out = [max(1, int(x)) for x in ideal]
    while sum(out) > cells:  # the minimum of one took cells from the others: take back from the largest
        out[max(range(len(out)), key=lambda i: out[i])] -= 1
    order = sorted(range(len(sizes)), key=lambda i: -(ideal[i] - out[i]))
    for i in order[: cells - sum(out)]:
        out[i] += 1
    return out


def peak_cell(peak: int | None, scale: int, width: int) -> int | None:
    """The cell the peak falls in (cell ``i`` measures ``i/width`` up to ``(i+1)/width`` of ``scale``),
    the last one when it fills the bar or more; None without a peak."""
    if peak is None or peak <= 0 or scale <= 0 or width <= 0:
        return None
    return min(width - 1, int(peak / scale * width))


def zoom_of(tops: Sequence[tuple[int, int]]) -> int:
    """How many times the bars are magnified: 1, or, when every rank's ``top`` (its highest figure)
    is under ``1/ZOOM_FROM`` of its ``whole``, the whole number that brings the highest to the end.

    ``tops``: (top, whole) of every rank drawn stacked.  One factor for all, so bars stay comparable.
    """
    ratios = [whole / top for top, whole in tops if top > 0 and whole > 0]
    if not ratios or min(ratios) < ZOOM_FROM:
        return 1
    return int(min(ratios))


@dataclass(frozen=True, slots=True)
class LegendEntry:
    """One word of the legend: the glyph the bar draws it with, its short name, its size."""

    name: str
    glyph: str
    bytes: int

    @property
    def text(self) -> str:
        return f"{self.glyph}{SHORT.get(self.name, self.name)} {short_bytes(self.bytes)}"


def legend_entries(parts: Sequence[BarPart], runs: Sequence[BarRun]) -> tuple[LegendEntry, ...]:
    """Every part with the glyph it is drawn with (``▪`` when it is in the small run), in bar order."""
    in_small = {name for r in runs if r.name == SMALL for name in r.holds}
    return tuple(LegendEntry(p.name, GLYPHS[SMALL] if p.name in in_small else glyph(p.name), p.bytes) for p in parts)


@dataclass(frozen=True, slots=True)
class Legend:
    """The legend as laid out: lines of entries, and what the last line ends with for those left out."""

    lines: tuple[tuple[LegendEntry, ...], ...]
    more: str
    """`` +2`` when two parts are left out (``…`` where that does not fit); empty when none is."""


def legend_lines(
    entries: Sequence[LegendEntry], width: int, lines: int, last: Sequence[LegendEntry] = ()
) -> Legend:
    """The largest entries that fit in ``lines`` lines of ``width`` cells, written in bar order.

    ``last`` (the peak) is kept before any part and written after them.  While some part is
    left out, a cell stays free for the ``…`` that says so.
    """

    def fits(shown: Sequence[LegendEntry]) -> tuple[tuple[LegendEntry, ...], ...] | None:
        reserve = 0 if len(shown) == len(entries) else 1
        return _flow(_ordered(shown, entries, tail), width, lines, reserve)

    tail = [e for e in last if _flow([e], width, lines, 1) is not None]
    shown: list[LegendEntry] = []
    for entry in sorted(entries, key=lambda e: -e.bytes):
        if fits([*shown, entry]) is None:
            break
        shown.append(entry)
    flowed = fits(shown) or ()
    left = len(entries) - len(shown)
    used = sum(cell_len(e.text) + 1 for e in flowed[-1]) - 1 if flowed else -1
    more = ""
    if left:
        more = next((m for m in (f" +{left}", "…") if used + cell_len(m) <= width), "")
    return Legend(flowed, more)


def _ordered(
    shown: Sequence[LegendEntry], entries: Sequence[LegendEntry], tail: Sequence[LegendEntry]
) -> list[LegendEntry]:
    return [e for e in entries if e in shown] + list(tail)


def _flow(
    entries: Sequence[LegendEntry], width: int, lines: int, reserve: int = 0
) -> tuple[tuple[LegendEntry, ...], ...] | None:
    """``entries`` laid out word by word in at most ``lines`` lines, ``reserve`` cells left free at the
    end of the last; None when they do not fit."""
    out: list[list[LegendEntry]] = []
    used = 0
    for i, entry in enumerate(entries):
        n = cell_len(entry.text)
        room = width - (reserve if i == len(entries) - 1 else 0)
        if out and used + 1 + n <= room:
            out[-1].append(entry)
            used += 1 + n
        elif len(out) < lines and n <= room:
            out.append([entry])
            used = n
        else:
            return None
    return tuple(tuple(line) for line in out)
