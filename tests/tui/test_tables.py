"""A table's rows painted before their columns were measured are painted again at the measured widths."""

from __future__ import annotations

from textual.app import App, ComposeResult

from shardtop.tui.repaint import CellsTable


class OneTable(App[None]):
    CSS = "CellsTable { height: 4; width: 40; }"  # a fixed region, as the home screen gives its run list

    def compose(self) -> ComposeResult:
        yield CellsTable()


async def test_rows_painted_before_they_were_measured_are_painted_again() -> None:
    """A busy loop can paint new rows before the table measures them, at their columns' header widths.

    Measuring them widens the table's virtual size but not its region: nothing told the table that the
    rows it had painted were cut, and a run list showed ``fsd`` for ``fsdp2-mlp-4644``."""
    app = OneTable()
    async with app.run_test(size=(60, 6)) as pilot:
        table = app.query_one(CellsTable)
        table.add_column("RUN", key="RUN")
        table.add_column("STATUS", key="STATUS")
        table.add_row("fsdp2-mlp-4644", "finished", key="a")
        assert "fsdp2-mlp-4644" not in app.export_screenshot()  # painted now, before the table measured the row
        await pilot.pause()
        assert table.columns["RUN"].content_width == len("fsdp2-mlp-4644")  # measured since
        shown = app.export_screenshot()
        assert "fsdp2-mlp-4644" in shown.replace("&#160;", " ") and "finished" in shown
