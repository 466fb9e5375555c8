"""The footer shows the keys of what has the focus, and follows the focus."""

from __future__ import annotations

from pathlib import Path

from shardtop.tui.screens.run_view import RunScreen
from shardtop.tui.widgets.run_list import RunList
from shardtop.tui.widgets.search_bar import SearchBar
from tests.support.apps import app_for
from tests.support.footer import footer_keys
from tests.support.waiting import wait_for


async def test_the_footer_follows_the_focus(recorded_root: Path) -> None:
    app = app_for(recorded_root)
    async with app.run_test(size=(160, 48)) as pilot:
        runs = app.screen.query_one(RunList)
        await wait_for(pilot, lambda: runs.row_count > 0, what="the run list")
        await pilot.press("u")
        await wait_for(pilot, lambda: "Open run" in footer_keys(app), what="the run list's key in the footer")
        await pilot.press("p")
        await wait_for(pilot, lambda: "Open run" not in footer_keys(app), what="the footer without it")
        assert "Launch" in footer_keys(app)

        await pilot.press("u", "enter")
        await wait_for(pilot, lambda: isinstance(app.screen, RunScreen), what="the run view")
        await wait_for(pilot, lambda: "Find" in footer_keys(app), what="the run view's keys")
        assert "Close search" not in footer_keys(app)
        await pilot.press("slash")
        await wait_for(pilot, lambda: app.screen.query_one(SearchBar).display, what="the search bar")
        await wait_for(pilot, lambda: "Close search" in footer_keys(app), what="the search bar's key in the footer")
        await pilot.press("escape")
        await wait_for(pilot, lambda: "Close search" not in footer_keys(app), what="the footer without it")
