"""``ProcessTable``: the processes holding GPU memory, one line per pid, each cell its own piece.

Over SSH a changed CPU figure should cost its own few cells.  Textual resends a
changed line of a widget from the widget's left edge, so a table drawn as one
widget (a ``DataTable``) resends a row's start for every new figure: about 170
bytes per process per second.  Here each row is a ``PiecedLine`` with one piece
per column, so a new CPU % resends only the CPU cells of that row.
"""

from __future__ import annotations

from collections.abc import Mapping

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import VerticalScroll

from shardtop.gpus import GpuProcessInfo
from shardtop.tui.format import PROCESS_COLUMNS as COLUMNS
from shardtop.tui.format import process_cells
from shardtop.tui.repaint import PiecedLine, set_border_text
from shardtop.tui.watch.run_catalog import RankOwner
from shardtop.words import column_widths, plural

__all__ = ["COLUMNS", "ProcessRow", "ProcessTable", "process_cells"]


class ProcessRow(PiecedLine):
    """One line of the table: a piece per column, padded to the column's width so the columns line up."""

    DEFAULT_CSS = """
    ProcessRow {
        width: 1fr;
    }
    """

    PIECES = len(COLUMNS)

    def __init__(self, cells: tuple[str, ...], widths: tuple[int, ...], pid: int | None = None) -> None:
        super().__init__(id=f"pid-{pid}" if pid is not None else "process-header")
        self.pid = pid
        """The process this line is about; None for the header."""
        self.cells = cells
        """The words of each column (``process_cells``), or the column names for the header."""
        self.widths = widths
        """Cells of each column but the last, which takes the rest of the line."""

    def show(self, cells: tuple[str, ...], widths: tuple[int, ...]) -> None:
        """New words or column widths; the terminal gets only the cells that differ."""
        if cells != self.cells or widths != self.widths:
            self.cells, self.widths = cells, widths
            self.lay_out()

    def pieces(self) -> list[Text]:
        """A cell padded by one space on each side, as a ``DataTable`` draws it; the last one unpadded on the right."""
        *padded, last = self.cells
        return [Text(f" {cell.ljust(width)} ") for cell, width in zip(padded, self.widths, strict=True)] + [
            Text(f" {last}")
        ]


class ProcessTable(VerticalScroll):
    """Processes on the GPUs (NVML + psutil): a header, then a row per pid; scrolls when they do not fit.

    Rows are keyed by pid and come and go with their processes; a row that stays
    is never rebuilt.  The columns are as wide as their widest cell, as in a
    ``DataTable``; when that changes (a longer user name, say) every row is laid
    out again, which is rare.  A command wider than the line ends in ``…``.
    """

    DEFAULT_CSS = """
    ProcessTable {
        height: auto;
        min-height: 3;  /* the header, docked, counts for nothing in an auto height without rows */
        max-height: 10;
        &:focus, &:focus > #process-header {
            background-tint: $foreground 5%;
        }
        & > #process-header {
            dock: top;
            text-style: bold;
            background: $panel;
        }
    }
    """

    def __init__(self, id: str | None = None, classes: str | None = None) -> None:
        super().__init__(id=id, classes=classes)
        self.border_title = "Processes on the GPUs"
        self._header = ProcessRow(COLUMNS, column_widths([COLUMNS])[:-1])
        self._rows: dict[int, ProcessRow] = {}

    def compose(self) -> ComposeResult:
        yield self._header

    @property
    def row_count(self) -> int:
        """How many processes the table lists (shown or scrolled out of sight)."""
        return len(self._rows)

    @property
    def pids(self) -> tuple[int, ...]:
        """The pids listed, top to bottom."""
        return tuple(row.pid for row in self.query_children(ProcessRow) if row.pid is not None)

    def show(self, processes: tuple[GpuProcessInfo, ...], owners: Mapping[int, RankOwner]) -> None:
        """Add, update or remove a row per pid; only the cells that changed reach the terminal."""
        if not self.is_attached:
            return  # removed (the app quits): nothing to mount rows into
        wanted = {p.pid: process_cells(p, owners) for p in processes}
        for pid in [pid for pid in self._rows if pid not in wanted]:
            self._rows.pop(pid).remove()
        widths = column_widths([COLUMNS, *wanted.values()])[:-1]
        self._header.show(COLUMNS, widths)
        before: ProcessRow | None = None
        for pid, cells in wanted.items():
            row = self._rows.get(pid)
            if row is None:
                row = self._rows[pid] = ProcessRow(cells, widths, pid)
                if before is None:
                    self.mount(row, after=self._header)
                else:
                    self.mount(row, after=before)
            else:
                row.show(cells, widths)
            before = row
        count = len(processes)
        set_border_text(self, subtitle=plural(count, "process", "processes") if processes else "none")

