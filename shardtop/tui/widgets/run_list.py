"""``RunList``: live and recent runs, newest first; Enter opens one.

Narrower than ``NARROW_WIDTH`` (an 80-column terminal), the list keeps what says how a run went: its
name, its status word, its step and the note that names an OOM (``NARROW_COLUMNS``); ranks, hosts and
the start time go, and the status loses its detail (the exit code).
"""

from __future__ import annotations

from rich.text import Text
from textual.binding import Binding
from textual.widgets.data_table import RowDoesNotExist

from shardtop.rundir.run_status import RunState
from shardtop.tui.format import STATUS_MARKS, short_run_id, truncate
from shardtop.tui.repaint import CellsTable
from shardtop.tui.watch.run_catalog import RunRow

COLUMNS = ("RUN", "STATUS", "RANKS", "HOSTS", "STEP", "STARTED", "NOTE")
NARROW_COLUMNS = ("RUN", "STATUS", "STEP", "NOTE")
NARROW_WIDTH = 70
"""Below this many cells the list shows ``NARROW_COLUMNS``."""
HOST_NAME_WIDTH = 12
"""A run on one host shows the host's name, cut to this many cells."""


def status_text(state: RunState, status: str, rehearsal: bool = False) -> Text:
    """``✗ failed (exit 1)`` styled by its state word (CSS-free: the table renders Rich text);
    ``✓ rehearsal finished`` for a rehearsal, said where a narrow terminal still shows it; ``status``
    is the state word alone (``failed``) in a narrow list."""
    mark = STATUS_MARKS.get(state, "·")
    style = {"running": "bold", "failed": "bold", "lost": "italic"}.get(state, "")
    return Text(f"{mark} {'rehearsal ' if rehearsal else ''}{status}", style=style)


def hosts_cell(hosts: tuple[str, ...]) -> str:
    """How many hosts a run's ranks ran on, or the host's name when one; ``-`` before any rank said."""
    if len(hosts) == 1:
        return truncate(hosts[0], HOST_NAME_WIDTH)
    return str(len(hosts)) if hosts else "-"


def run_cells(row: RunRow, columns: tuple[str, ...] = COLUMNS) -> tuple[str | Text, ...]:
    """The row's cells under ``columns``."""
    s = row.summary
    narrow = columns != COLUMNS
    cells: dict[str, str | Text] = {
        "RUN": short_run_id(s.id),
        "STATUS": status_text(s.state, s.state if narrow else s.status, s.rehearsal is not None),
        "RANKS": s.ranks_short,
        "HOSTS": hosts_cell(s.hosts),
        "STEP": str(s.step),
        "STARTED": s.started,
        "NOTE": s.note,
    }
    return tuple(cells[c] for c in columns)


class RunList(CellsTable):
    """The runs under the runs root; rows keyed by run id, only changed cells repainted."""

    BINDINGS = [Binding("enter", "select_cursor", "Open run", show=True)]

    DEFAULT_CSS = """
    RunList {
        height: 1fr;
    }
    """

    def __init__(self, id: str | None = None, classes: str | None = None) -> None:
        super().__init__(id=id, classes=classes, cursor_type="row")
        self.border_title = "Runs"
        self._run_rows: dict[str, RunRow] = {}
        self._columns: tuple[str, ...] = ()

    def on_mount(self) -> None:
        self._set_columns(COLUMNS)

    def on_resize(self) -> None:
        wanted = NARROW_COLUMNS if 0 < self.size.width < NARROW_WIDTH else COLUMNS
        if wanted != self._columns:
            chosen = self.selected()
            self._set_columns(wanted)
            self.show(tuple(self._run_rows.values()))
            if chosen is not None:
                self.move_cursor(row=self.get_row_index(chosen.summary.id), animate=False)

    def _set_columns(self, columns: tuple[str, ...]) -> None:
        self.clear(columns=True)
        self._columns = columns
        for name in columns:
            self.add_column(name, key=name)

    def show(self, rows: tuple[RunRow, ...]) -> None:
        """Update changed cells in place; rebuild only when runs came or went (a run started)."""
        wanted = {r.summary.id: r for r in rows}
        order = [r.summary.id for r in rows]
        columns = self._columns
        if [k.value for k in self.rows] != order:
            chosen = self.selected()
            self.clear()
            for key in order:
                self.add_row(*run_cells(wanted[key], columns), key=key)
            if chosen is not None and chosen.summary.id in wanted:
                self.move_cursor(row=self.get_row_index(chosen.summary.id), animate=False)
        else:
            for key in order:
                if self._run_rows.get(key) != wanted[key]:
                    self.update_row(key, zip(columns, run_cells(wanted[key], columns), strict=True))
        self._run_rows = wanted
        live = sum(1 for r in rows if r.live)
        self.set_border_text(subtitle=f"{live} live · {len(rows)} shown" if rows else "none yet: launch a preset")

    def selected(self) -> RunRow | None:
        if not self.row_count:
            return None
        try:
            key = self.coordinate_to_cell_key(self.cursor_coordinate).row_key.value
        except (RowDoesNotExist, LookupError):
            return None
        return self._run_rows.get(key or "")
