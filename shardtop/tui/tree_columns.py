"""The shard tree's columns: how wide each is at a given width, and cells cut to size.

Pure: no Textual, so the layout rules are unit-tested on their own.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from rich.cells import cell_len
from rich.segment import Segment
from rich.style import Style


@dataclass(frozen=True)
class TreeColumns:
    """Cell widths of the tree's columns for one widget width."""

    name: int
    type: int
    params: int
    state: int
    rank: int
    ranks_shown: int
    """Rank columns drawn one per rank; 0 with ``range`` > 0: one min…max column."""
    range: int


def tree_columns(width: int, nranks: int) -> TreeColumns:
    """Widest layout that leaves the module names 24 cells; else ranks fold into min…max."""
    for type_w, state_w in ((16, 12), (12, 12), (12, 0), (10, 0)):
        name = width - (type_w + 1) - 8 - (state_w + 1 if state_w else 0) - nranks * 8
        if name >= 24:
            return TreeColumns(name, type_w, 7, state_w, 7, nranks, 0)
    return TreeColumns(max(12, width - 11 - 8 - 16), 10, 7, 0, 7, 0, 15 if nranks else 0)


def fit(parts: Sequence[tuple[str, Style]], width: int, pad: Style) -> list[Segment]:
    """Segments of ``parts`` cut or padded to exactly ``width`` cells (cut text ends in …)."""
    out: list[Segment] = []
    used = 0
    for text, style in parts:
        n = cell_len(text)
        if used + n > width:
            room = width - used
            if room > 0:
                cut = text[: max(0, room - 1)]
                out.append(Segment(cut + "…", style))
                used += cell_len(cut) + 1
            break
        out.append(Segment(text, style))
        used += n
    if used < width:
        out.append(Segment(" " * (width - used), pad))
    return out
