"""The process table over SSH: a new figure repaints its own cells only; rows follow their pids.

Driven with the eight H200s' recorded processes (six ranks of one job, another
user's process psutil cannot read).
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from textual.app import App, ComposeResult
from textual.geometry import Region
from textual.widget import Widget

from shardtop.gpus import GpuProcessInfo
from shardtop.tui.repaint import LinePiece
from shardtop.tui.widgets.process_table import COLUMNS, ProcessRow, ProcessTable
from tests.support.recorded import OTHER_USER_PID, TRAINER_PIDS, eight_h200_processes
from tests.support.waiting import settled

CSS = Path(__file__).resolve().parents[2] / "shardtop" / "tui" / "shardtop.tcss"
CPU = COLUMNS.index("CPU %")


class TableApp(App[None]):
    CSS_PATH = CSS

    def compose(self) -> ComposeResult:
        yield ProcessTable(id="processes")


def recorded(*pids: int) -> tuple[GpuProcessInfo, ...]:
    processes = eight_h200_processes()
    return tuple(processes[pid] for pid in pids)


def line(row: ProcessRow) -> str:
    """A row as the pieces show it side by side."""
    return "".join(piece.text.plain for piece in row.query(LinePiece))


class Repaints:
    """Every refresh asked of the table, its lines and their pieces (widget, regions, layout)."""

    def __init__(self, table: ProcessTable) -> None:
        self.asked: list[tuple[Widget, tuple[Region, ...], bool]] = []
        for widget in [table, *table.query(Widget)]:
            self._watch(widget)

    def _watch(self, widget: Widget) -> None:
        refresh = widget.refresh

        def recorded(*regions: Region, repaint: bool = True, layout: bool = False, recompose: bool = False) -> Widget:
            self.asked.append((widget, regions, layout))
            return refresh(*regions, repaint=repaint, layout=layout, recompose=recompose)

        widget.refresh = recorded  # type: ignore[method-assign]


async def test_a_new_cpu_figure_repaints_only_its_own_cells() -> None:
    app = TableApp()
    async with app.run_test(size=(160, 20)) as pilot:
        table = app.query_one(ProcessTable)
        processes = recorded(*TRAINER_PIDS, OTHER_USER_PID)
        table.show(processes, {})
        await settled(pilot)
        row = app.query_one(f"#pid-{TRAINER_PIDS[2]}", ProcessRow)
        cpu_piece = list(row.query(LinePiece))[CPU]
        assert cpu_piece.text.plain == " 99    ", "CPU % is padded to its column, as the header 'CPU %'"
        repaints = Repaints(table)

        busier = tuple(replace(p, cpu_percent=57.0) if p.pid == TRAINER_PIDS[2] else p for p in processes)
        table.show(busier, {})
        await settled(pilot)

        assert cpu_piece.text.plain == " 57    "
        assert [(widget, regions, layout) for widget, regions, layout in repaints.asked] == [
            (cpu_piece, (Region(1, 0, 2, 1),), False)
        ], "only the two cells of the CPU figure are repainted: not the row, not the table"
        assert cpu_piece.region.x > row.region.x + 40, "the piece starts at its column, far from the row's start"
        assert app.screen.get_widget_at(cpu_piece.region.x + 1, cpu_piece.region.y)[0] is cpu_piece
        assert "57" in line(row) and line(row).startswith(f" {TRAINER_PIDS[2]}  trainer")


async def test_rows_come_and_go_with_their_pids_and_the_others_stay() -> None:
    app = TableApp()
    async with app.run_test(size=(160, 20)) as pilot:
        table = app.query_one(ProcessTable)
        first, second, third, fourth = TRAINER_PIDS[:4]
        table.show(recorded(first, second, third), {})
        await settled(pilot)
        assert table.pids == (first, second, third) and table.row_count == 3
        assert table.border_subtitle == "3 processes"
        kept = app.query_one(f"#pid-{first}", ProcessRow), app.query_one(f"#pid-{third}", ProcessRow)

        table.show(recorded(first, third, fourth), {})  # the second rank ended, a fourth started
        await settled(pilot)
        assert table.pids == (first, third, fourth), "the ended process's row is gone, the new one is added"
        assert not app.query(f"#pid-{second}")
        assert (app.query_one(f"#pid-{first}"), app.query_one(f"#pid-{third}")) == kept, "rows that stay are kept"
        fourth_row = app.query_one(f"#pid-{fourth}", ProcessRow)
        assert line(fourth_row).startswith(f" {fourth}  trainer") and fourth_row.region.height == 1

        table.show(recorded(first), {})
        await settled(pilot)
        assert table.pids == (first,) and table.border_subtitle == "1 process"
        table.show((), {})
        await settled(pilot)
        assert table.row_count == 0 and table.border_subtitle == "none"
        assert table.region.height == 3, "the border and the header"


async def test_a_wider_cell_widens_its_column_on_every_line() -> None:
    app = TableApp()
    async with app.run_test(size=(160, 20)) as pilot:
        table = app.query_one(ProcessTable)
        table.show(recorded(*TRAINER_PIDS[:2]), {})
        await settled(pilot)
        header = app.query_one("#process-header", ProcessRow)
        assert line(header).index("GPU ") == line(app.query_one(f"#pid-{TRAINER_PIDS[0]}", ProcessRow)).index(" 0 ") + 1

        table.show(recorded(*TRAINER_PIDS[:2], OTHER_USER_PID), {})  # "alice (other user)" is the widest USER
        await settled(pilot)
        lines = [line(header), *(line(app.query_one(f"#pid-{pid}", ProcessRow)) for pid in table.pids)]
        columns = {text.index(word) for text, word in zip(lines, ("GPU MEM", "13.7G", "14.1G", "37.7G"), strict=True)}
        assert len(columns) == 1, f"GPU MEM lines up on every line: {lines}"
        assert lines[0].index("GPU ") > len(" PID      alice (other user)"), "the USER column holds the widest name"


async def test_more_processes_than_fit_scroll_under_a_header_that_stays() -> None:
    app = TableApp()
    async with app.run_test(size=(100, 30)) as pilot:
        table = app.query_one(ProcessTable)
        template = eight_h200_processes()[TRAINER_PIDS[0]]
        table.show(tuple(replace(template, pid=pid) for pid in range(1000, 1020)), {})
        await settled(pilot)
        header = app.query_one("#process-header", ProcessRow)
        top = header.region
        assert table.region.height == 10 and table.border_subtitle == "20 processes", "max-height 10: a page of 7"
        table.focus()
        await pilot.press("end")
        await settled(pilot)
        assert table.has_focus and table.scroll_y > 0
        assert header.region == top, "the header stays on top while the rows scroll"
        last = app.query_one("#pid-1019", ProcessRow)
        assert table.content_region.contains_region(last.region), "the last process scrolled into view"
