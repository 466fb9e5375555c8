"""At 80×24 (a laptop's SSH window) what a user needs stays on screen: every key of the run view's footer,
and in the run list each run's step and the note that says it ran out of memory."""

from __future__ import annotations

from pathlib import Path

from shardtop.tui.widgets.keys_footer import KeysFooter
from shardtop.tui.widgets.run_list import RunList
from tests.support.apps import app_for, home_ready, run_ready
from tests.support.footer import footer_keys
from tests.support.recorded import copy_runs
from tests.support.waiting import settled


async def test_the_run_views_footer_keeps_every_key_at_80_columns(recorded_root: Path) -> None:
    app = app_for(recorded_root, run="zero3-linear-21d1")
    async with app.run_test(size=(80, 24)) as pilot:
        await run_ready()(pilot)
        footer = app.screen.query_one(KeysFooter)
        keys = footer_keys(app)
        for key in ("⏎ Open/close", "/ Find", "o OOM", "r Report", "esc Home", "k Stop run", "q Quit", "? Help"):
            assert key in keys, key
        assert all(key.region.right <= 80 for key in footer.children), "no key past the right edge"
        await pilot.resize_terminal(160, 48)
        await settled(pilot)
        assert "^p palette" in footer_keys(app), "wide, the palette's key comes back"


async def test_the_run_list_keeps_the_step_and_the_oom_note_at_80_columns(recorded_root: Path) -> None:
    copy_runs(recorded_root, "h200x2/zero3-linear", "cpu-6ranks/zero3-linear")
    app = app_for(recorded_root)
    async with app.run_test(size=(80, 24)) as pilot:
        await home_ready()(pilot)
        table = app.screen.query_one(RunList)
        shown = [table.render_line(y).text for y in range(table.size.height)]
        header = shown[0].split()
        assert header[:2] == ["RUN", "STATUS"] and "STEP" in header and "NOTE" in header
        oom = next(line for line in shown if "zero3-linear-21d1" in line)
        assert oom.split()[1:4] == ["✗", "failed", "0"] and "OOM" in oom, "status, step and the OOM in view"
        finished = next(line for line in shown if "zero3-linear-b160" in line)
        assert finished.split()[1:4] == ["✓", "finished", "2"]
        await pilot.resize_terminal(160, 48)
        await settled(pilot)
        assert [c.label.plain for c in table.columns.values()][2:6] == ["RANKS", "HOSTS", "STEP", "STARTED"]
