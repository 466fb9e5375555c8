"""Drawing a rank's stacked memory bar and its legend in ``RankMemory``'s colours.

The arithmetic (which part gets how many cells, where the peak falls, the
legend's choice) is ``memory_bar``'s; here each run becomes styled text, its
colour from the widget's component classes (``rank-memory--optimizer``...), so
the ``.tcss`` decides the colours and ``NO_COLOR`` keeps the glyphs.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from rich.style import Style
from rich.text import Text

from shardtop.tui.memory_bar import (
    FREE,
    PEAK,
    SMALL,
    BarPart,
    BarRun,
    LegendEntry,
    glyph,
    legend_entries,
    legend_lines,
    peak_cell,
    stacked_runs,
)

Styles = Callable[[str], Style]
"""The widget's ``get_component_rich_style``."""


def part_style(style: Styles, name: str, holds: tuple[str, ...] = ()) -> Style:
    """A part's colour; the small run takes its one part's, or its own for several."""
    if name == SMALL and len(holds) == 1:
        name = holds[0]
    return style(f"rank-memory--{name}")


def zoom_words(zoom: int, words: bool) -> str:
    """`` zoom ×47`` (`` ×47`` without ``words``) after a magnified bar; empty when it is not."""
    return ((" zoom" if words else "") + f" ×{zoom}") if zoom > 1 else ""


def stacked_bar(
    out: Text, parts: Sequence[BarPart], peak: int | None, scale: int, width: int, zoom: str, style: Styles
) -> tuple[BarRun, ...]:
    """``parts`` in ``width - len(zoom)`` cells measuring ``scale`` bytes, then ``zoom``; the peak a ``│``
    in its cell, over that cell's colour.  Returns the runs drawn, for the legend."""
    cells = max(4, width - len(zoom))
    mark = peak_cell(peak, scale, cells)
    runs = stacked_runs(parts, scale, cells)
    at = 0
    for run in runs:
        colour = part_style(style, run.name, run.holds)
        text = glyph(run.name) * run.cells
        if mark is not None and at <= mark < at + run.cells:
            i = mark - at
            under = Style(bgcolor=colour.color) if run.name != FREE and colour.color else Style()
            out.append(text[:i], colour)
            out.append(PEAK, colour + under + style("rank-memory--peak"))
            out.append(text[i + 1 :], colour)
        else:
            out.append(text, colour)
        at += run.cells
    out.append(zoom, style("rank-memory--muted"))
    return runs


def bar_legend(
    out: Text,
    parts: Sequence[BarPart],
    runs: tuple[BarRun, ...],
    width: int,
    lines: int,
    indent: str,
    peak: LegendEntry | None,
    style: Styles,
) -> None:
    """``█param 3.91G █optim 3.91G ▒cache 3.17G │peak 11.7G``, each on a new line after ``indent``: the
    largest parts that fit in ``lines`` lines, in bar order, each glyph as ``runs`` drew it, in its colour."""
    laid = legend_lines(legend_entries(parts, runs), width, lines, [peak] if peak else [])
    for line in laid.lines:
        out.append("\n" + indent)
        for i, entry in enumerate(line):
            out.append("" if i == 0 else " ")
            out.append(entry.glyph, part_style(style, entry.name))
            out.append(entry.text[len(entry.glyph) :])
    out.append(laid.more, style("rank-memory--muted"))
