"""Repaint only the cells that changed, so that a screen over SSH costs what changed on it.

Textual sends a widget's whole region to the terminal whenever the widget is
refreshed; it does not compare with what the terminal already shows.  A GPU
line whose power figure went from 122 W to 123 W would resend its 120 cells
with their styles, every second, for every GPU.  The two tools here refresh
only the region that differs, through the public ``Widget.refresh(*regions)``:

- ``PaintsChanges``: for a widget whose ``render()`` is a Rich ``Text``; it
  compares the text now on screen with the text it would draw now, cell by
  cell, and refreshes the spans that differ.
- ``PiecedLine``: a one-line widget made of side-by-side ``LinePiece``s.
  Textual resends a changed line of a widget from the widget's left edge up to
  the last changed cell; a figure at the end of a long line would resend the
  whole line.  As pieces, a changed figure resends only its own piece.
- ``CellsTable``: for a ``DataTable``; a row's cells are written only where
  they differ, and only those cells are refreshed (``update_cell`` alone
  refreshes the whole table); rows painted before their columns were measured
  are painted again.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from rich.cells import cell_len
from rich.style import Style
from rich.text import Text
from textual.app import ComposeResult
from textual.coordinate import Coordinate
from textual.geometry import Region, Size
from textual.widget import Widget
from textual.widgets import DataTable

Cell = tuple[str, tuple[str | Style, ...]]


def _cells(line: Text) -> list[Cell] | None:
    """Each character with the styles over it; None where a character is not one cell wide."""
    plain = line.plain
    if cell_len(plain) != len(plain):
        return None
    styles: list[list[str | Style]] = [[line.style] if line.style else [] for _ in plain]
    for span in line.spans:
        for i in range(max(0, span.start), min(len(plain), span.end)):
            styles[i].append(span.style)
    return [(ch, tuple(s)) for ch, s in zip(plain, styles, strict=True)]


def changed_regions(before: Text, after: Text, width: int) -> list[Region] | None:
    """The regions (one per line that changed, in content cells) that differ between two renders.

    None when the line count changed or a line holds wide characters: then the
    whole widget must be refreshed.  A line cut at ``width`` (with an ellipsis)
    is compared up to its last visible cell.
    """
    old_lines, new_lines = before.split("\n", allow_blank=True), after.split("\n", allow_blank=True)
    if len(old_lines) != len(new_lines):
        return None
    regions = []
    for y, (old_line, new_line) in enumerate(zip(old_lines, new_lines, strict=True)):
        old, new = _cells(old_line), _cells(new_line)
        if old is None or new is None:
            return None
        if old == new:
            continue
        longest = max(len(old), len(new))
        first = next(x for x in range(longest) if x >= len(old) or x >= len(new) or old[x] != new[x])
        last = next(x for x in reversed(range(longest)) if x >= len(old) or x >= len(new) or old[x] != new[x])
        if first >= width:
            if longest > width:  # the change is past the edge; only the ellipsis may differ
                regions.append(Region(width - 1, y, 1, 1))
            continue
        last = min(last, width - 1)
        regions.append(Region(first, y, last - first + 1, 1))
    return regions


class PaintsChanges(Widget):
    """A widget that draws Rich text with ``draw()`` and, on ``repaint_changes()``, refreshes only what differs.

    Keep what ``draw()`` reads in reactives declared with ``repaint=False`` (or
    plain attributes) and call ``repaint_changes()`` after changing them; a
    resize or a theme change still repaints the whole widget, as Textual does.
    """

    _painted: Text | None = None
    _painted_width: int = 0

    def draw(self) -> Text:
        """The widget's content now."""
        raise NotImplementedError

    def render(self) -> Text:
        text = self.draw()
        self._painted = text
        self._painted_width = self.size.width
        return text

    def repaint_changes(self) -> None:
        """Refresh the cells that differ from what is on screen (everything, before the first paint)."""
        if not self.is_attached:
            return  # removed (the app quits): its styles are gone and nothing is on screen to refresh
        before = self._painted
        width = self.size.width
        if before is None or not width or width != self._painted_width:
            self.refresh()
            return
        regions = changed_regions(before, self.draw(), width)
        if regions is None:
            self.refresh(layout=self.styles.height is not None and self.styles.height.is_auto)
        elif regions:
            self.refresh(*regions)


class LinePiece(PaintsChanges):
    """One piece of a ``PiecedLine``: as wide as its text, or (the last) as the rest of the line."""

    DEFAULT_CSS = """
    LinePiece {
        width: auto;
        height: 1;
        text-wrap: nowrap;
    }
    LinePiece.-fill {
        width: 1fr;
    }
    """

    def __init__(self, fill: bool = False) -> None:
        super().__init__(classes="-fill" if fill else None)
        self.text = Text()
        """What this piece shows; set through ``show``."""
        self.fill = fill
        """Takes the rest of the line, so its text can grow or shrink without moving anything."""

    def draw(self) -> Text:
        return self.text

    def get_content_width(self, container: Size, viewport: Size) -> int:
        return self.text.cell_len

    def show(self, text: Text) -> None:
        """Show ``text``: a relayout of the line if the piece's width changed, else only the cells that differ."""
        old, self.text = self.text, text
        if not self.is_mounted:
            return
        if text.cell_len != old.cell_len and not self.fill:
            self.refresh(layout=True)  # the pieces after it move
        else:
            self.repaint_changes()


def cut_at(pieces: Sequence[Text], width: int) -> list[Text]:
    """The pieces cut at ``width`` cells with an ellipsis, as one text of them all would be cut."""
    if sum(p.cell_len for p in pieces) <= width:
        return list(pieces)
    line = Text("").join(pieces)
    line.truncate(width, overflow="ellipsis")
    out, at = [], 0
    for piece in pieces:
        out.append(line[at : at + len(piece)])
        at += len(piece)
    return out


class PiecedLine(Widget):
    """One line drawn as ``pieces()`` side by side, each its own ``LinePiece``; call ``lay_out()`` after a change."""

    DEFAULT_CSS = """
    PiecedLine {
        layout: horizontal;
        height: 1;
    }
    """

    PIECES = 1
    """How many pieces ``pieces()`` returns."""

    def __init__(self, id: str | None = None, classes: str | None = None) -> None:
        super().__init__(id=id, classes=classes)
        self._pieces = [LinePiece(fill=i == self.PIECES - 1) for i in range(self.PIECES)]

    def compose(self) -> ComposeResult:
        yield from self._pieces

    def pieces(self) -> list[Text]:
        """The line's pieces, left to right."""
        raise NotImplementedError

    def line(self) -> Text:
        """The whole line, as the pieces show it side by side."""
        return Text("").join(cut_at(self.pieces(), self.size.width or 80))

    def on_mount(self) -> None:
        self.lay_out()

    def on_resize(self) -> None:
        self.lay_out()

    def lay_out(self) -> None:
        """Give each piece its text; only what changed reaches the terminal.

        Nothing once the line left the screen: a sample that arrives while the app quits finds
        the widget's styles gone, and drawing it then would end the app with an error."""
        if not self.is_attached:
            return
        for piece, text in zip(self._pieces, cut_at(self.pieces(), self.size.width or 80), strict=True):
            piece.show(text)


class CellsTable(DataTable[Any]):
    """A ``DataTable`` whose rows are updated cell by cell, refreshing only the cells that changed."""

    _cells_only = False

    def refresh(self, *regions: Region, repaint: bool = True, layout: bool = False, recompose: bool = False) -> Any:
        if self._cells_only and not regions and not layout and not recompose:
            return self  # update_cell's whole-table refresh; the changed cells are refreshed one by one
        return super().refresh(*regions, repaint=repaint, layout=layout, recompose=recompose)

    def watch_virtual_size(self, old: Size, new: Size) -> None:
        """Repaint every row when the columns widen.

        A ``DataTable`` measures new rows' cells once its message queue runs dry.  Rows it painted
        before that, at their columns' old widths, stay in its caches under the same keys, so on a
        busy loop a run list could keep showing ``fsd`` for ``fsdp2-mlp-4644`` until something
        else repainted it.  ``notify_style_update`` empties those caches.
        """
        if new.width != old.width:
            self.notify_style_update()

    def update_row(self, row_key: str, cells: Mapping[str, Any] | Iterable[tuple[str, Any]]) -> int:
        """Write the cells of a row that differ (by column key); returns how many did."""
        items = cells.items() if isinstance(cells, Mapping) else cells
        row = self.get_row_index(row_key)
        changed = 0
        for column_key, value in items:
            if self.get_cell(row_key, column_key) == value:
                continue
            self._cells_only = True
            try:
                self.update_cell(row_key, column_key, value)
            finally:
                self._cells_only = False
            self.refresh_coordinate(Coordinate(row, self.get_column_index(column_key)))
            changed += 1
        return changed

    def set_border_text(self, title: str | None = None, subtitle: str | None = None) -> None:
        """Border title and subtitle, assigned only when they change (each assignment repaints the widget)."""
        set_border_text(self, title, subtitle)


def set_border_text(widget: Widget, title: str | None = None, subtitle: str | None = None) -> None:
    """``border_title`` / ``border_subtitle``, assigned only when different: Textual repaints on every assignment."""
    if title is not None and widget.border_title != title:
        widget.border_title = title
    if subtitle is not None and widget.border_subtitle != subtitle:
        widget.border_subtitle = subtitle
