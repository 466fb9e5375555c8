"""``LogPane``: the ranks' and the supervisor's output, tailed, warnings folded, long lines wrapped.

A ``ScrollView`` on the Line API: each entry of the folded log (``log_fold``)
is one or more screen lines (a long line wraps at its spaces, under itself,
after its source), drawn from a cache keyed by the entry's version and the width.  A
repeated warning changes its entry's count in place rather than adding a line.
While the view is at its end it follows new lines.
"""

from __future__ import annotations

import textwrap
from bisect import bisect_right
from collections.abc import Sequence
from itertools import accumulate

from rich.cells import cell_len
from rich.segment import Segment
from textual.cache import LRUCache
from textual.geometry import Size
from textual.scroll_view import ScrollView
from textual.strip import Strip

from shardtop.tui.log_fold import FoldedLog, LogEntry
from shardtop.tui.watch.log_tail import LogLine

LABEL_WIDTH = 6
"""Cells for the source (``runner``, ``r0,r1``) before the ``│``."""
WARNING_MARK = "⚠ "


def entry_lines(entry: LogEntry, width: int) -> list[str]:
    """The entry's words wrapped at spaces (a word longer than a line is cut) into lines that fit ``width``
    after the source column."""
    room = max(8, width - LABEL_WIDTH - 3)
    words = (WARNING_MARK if entry.warning is not None else "") + entry.words
    if cell_len(words) <= room:
        return [words]
    return textwrap.wrap(words, room, break_on_hyphens=False) or [""]


class LogPane(ScrollView):
    """Every log line of the run; a warning once, with how often and from which ranks it came."""

    COMPONENT_CLASSES = {"log-pane--source", "log-pane--warning"}

    DEFAULT_CSS = """
    LogPane {
        height: 1fr;
        overflow-x: hidden;
        & > .log-pane--source {
            color: $text-muted;
        }
        & > .log-pane--warning {
            color: $text-warning;
        }
    }
    """

    def __init__(self, id: str | None = None, classes: str | None = None) -> None:
        super().__init__(id=id, classes=classes)
        self.folded = FoldedLog()
        self._heights: list[int] = []
        self._starts: list[int] = [0]
        """The first screen line of each entry, and one past the last line."""
        self._width = 0
        self._cache: LRUCache[tuple[int, int, int], list[Strip]] = LRUCache(1024)

    def append(self, lines: Sequence[LogLine]) -> None:
        if not lines:
            return
        following = self.is_vertical_scroll_end or self.max_scroll_y == 0
        changed = self.folded.add(lines)
        if len(changed) == len(self.folded.entries):
            self._cache.clear()
        self._measure(changed)
        if following:
            self.scroll_end(animate=False, immediate=True, x_axis=False)
        self.refresh()

    def on_resize(self) -> None:
        self._measure(set(range(len(self.folded.entries))))

    def notify_style_update(self) -> None:
        super().notify_style_update()
        self._cache.clear()

    def _measure(self, changed: set[int]) -> None:
        """Lines per entry at this width, for the entries ``changed`` (all of them at a new width)."""
        width = self.scrollable_content_region.width
        if width != self._width:
            self._width, changed = width, set(range(len(self.folded.entries)))
        entries = self.folded.entries
        del self._heights[len(entries) :]
        self._heights.extend([0] * (len(entries) - len(self._heights)))
        for i in changed:
            self._heights[i] = len(entry_lines(entries[i], width))
        self._starts = [0, *accumulate(self._heights)]
        self.virtual_size = Size(width, self._starts[-1])

    def render_line(self, y: int) -> Strip:
        width = self.scrollable_content_region.width
        line = round(self.scroll_y) + y
        if not self.folded.entries or line >= self._starts[-1]:
            return Strip.blank(width, self.rich_style)
        index = bisect_right(self._starts, line) - 1
        entry = self.folded.entries[index]
        key = (index, entry.version, width)
        strips = self._cache.get(key)
        if strips is None:
            strips = self._cache[key] = self._strips(entry, width)
        at = line - self._starts[index]
        return strips[at] if at < len(strips) else Strip.blank(width, self.rich_style)

    def _strips(self, entry: LogEntry, width: int) -> list[Strip]:
        base = self.rich_style
        source = base + self.get_component_rich_style("log-pane--source")
        words = base + self.get_component_rich_style("log-pane--warning") if entry.warning is not None else base
        out = []
        for i, text in enumerate(entry_lines(entry, width)):
            label = f"{entry.label[:LABEL_WIDTH]:>{LABEL_WIDTH}} │ " if i == 0 else " " * (LABEL_WIDTH + 3)
            strip = Strip([Segment(label, source), Segment(text, words)])
            out.append(strip.adjust_cell_length(width, base))
        return out
