"""``--read-only``: no binding, command or key that launches or stops anything exists."""

from __future__ import annotations

from pathlib import Path

from shardtop.rundir.run_directory import list_runs
from shardtop.tui.app import ShardtopApp
from shardtop.tui.screens.home import ControlledHomeScreen, HomeScreen
from shardtop.tui.screens.run_view import ControlledRunScreen, RunScreen
from shardtop.tui.widgets.preset_list import PresetList
from shardtop.tui.widgets.shard_tree import ShardTree
from tests.support.recorded import H200_HOST, RecordedHost, recorded_h200, recorded_run
from tests.support.waiting import wait_for

CHANGING_ACTIONS = {"stop", "launch"}


def actions(app: ShardtopApp) -> set[str]:
    return {active.binding.action for active in app.screen.active_bindings.values()}


def palette_titles(app: ShardtopApp) -> list[str]:
    return [c.title for c in app.get_system_commands(app.screen)]


async def test_read_only_home_has_no_launch_or_stop(recorded_root: Path) -> None:
    app = ShardtopApp(recorded_root, read_only=True, gpu_source=recorded_h200(), host_probe=RecordedHost(H200_HOST))  # type: ignore[arg-type]
    async with app.run_test(size=(120, 40)) as pilot:
        presets = app.screen.query_one(PresetList)
        await wait_for(pilot, lambda: presets.option_count > 0, what="the presets")
        assert type(app.screen) is HomeScreen
        assert not CHANGING_ACTIONS & actions(app)
        assert not [t for t in palette_titles(app) if t.startswith(("Launch", "Stop"))]
        before = [r.id for r in list_runs(recorded_root)]
        await pilot.press("p", "enter", "l", "k")
        await pilot.pause()
        assert type(app.screen) is HomeScreen, "no launch prompt, no confirmation"
        assert [r.id for r in list_runs(recorded_root)] == before
        assert "read-only" in (presets.border_title or "")


async def test_read_only_run_view_has_no_stop(recorded_root: Path) -> None:
    app = ShardtopApp(recorded_root, run=recorded_run("h200/zero3-linear").name, read_only=True)
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_for(
            pilot,
            lambda: app.screen.query(ShardTree) and app.screen.query_one(ShardTree).model is not None,
            what="the run view",
        )
        assert type(app.screen) is RunScreen
        assert "stop" not in actions(app) and not hasattr(app.screen, "action_stop")
        assert "Stop run" not in palette_titles(app)
        await pilot.press("k")
        assert type(app.screen) is RunScreen


async def test_without_read_only_the_actions_are_there(recorded_root: Path) -> None:
    app = ShardtopApp(recorded_root, gpu_source=recorded_h200(), host_probe=RecordedHost(H200_HOST))  # type: ignore[arg-type]
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.pause()
        assert type(app.screen) is ControlledHomeScreen and CHANGING_ACTIONS <= actions(app)
        app.open_run(list_runs(recorded_root)[-1])
        await pilot.pause()
        assert type(app.screen) is ControlledRunScreen and "stop" in actions(app)
