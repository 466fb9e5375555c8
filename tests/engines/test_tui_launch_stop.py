"""Launching a preset from the home screen and stopping it after a confirmation: real CPU processes."""

from __future__ import annotations

from pathlib import Path

import psutil
import pytest
from textual.widgets import Input, Static

from shardtop.launch import stop
from shardtop.rundir.run_directory import RunDirectory, list_runs
from shardtop.tui.app import ShardtopApp
from shardtop.tui.screens.confirm import ConfirmScreen
from shardtop.tui.screens.launch_prompt import LaunchPrompt
from shardtop.tui.screens.run_view import RunScreen
from shardtop.tui.widgets.preset_list import PresetList
from shardtop.tui.widgets.run_header import RunHeader
from tests.support.recorded import H200_HOST, RecordedHost, recorded_h200
from tests.support.waiting import wait_for

pytestmark = pytest.mark.timeout(300)


def alive(pids: list[tuple[int, float | None]]) -> list[int]:
    out = []
    for pid, _started in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                out.append(pid)
        except psutil.NoSuchProcess:
            continue
    return out


async def test_launch_from_home_then_stop_with_confirmation(tmp_path: Path) -> None:
    root = tmp_path / "runs"
    app = ShardtopApp(root, refresh=0.5, gpu_source=recorded_h200(), host_probe=RecordedHost(H200_HOST))  # type: ignore[arg-type]
    run: RunDirectory | None = None
    try:
        async with app.run_test(size=(120, 40)) as pilot:
            presets = app.screen.query_one(PresetList)
            await wait_for(pilot, lambda: presets.option_count > 0, what="the presets")
            await pilot.press("p")
            while presets.selected != "fsdp2-mlp":
                await pilot.press("down")
            await pilot.press("enter")
            assert isinstance(app.screen, LaunchPrompt)

            await pilot.press(*"max_steps=lots", "enter")
            error = app.screen.query_one("#launch-error", Static)
            assert isinstance(app.screen, LaunchPrompt) and error.has_class("-shown")
            assert "max_steps=lots" in str(error.content) and "integer" in str(error.content)
            assert list_runs(root) == [], "a bad override launches nothing"

            app.screen.query_one("#overrides", Input).value = ""
            # long enough to stay alive through the test; the runner makes every batch up front,
            # so max_steps=100000 would spend a minute and 6.5 GB per rank before the first hello
            await pilot.press(*"max_steps=3000", "enter")
            await wait_for(pilot, lambda: isinstance(app.screen, RunScreen), what="the run view")
            run = app.screen.run_dir  # type: ignore[attr-defined]
            assert run is not None and (run.path / "run.json").exists()
            assert run.read_meta().config.settings["max_steps"] == 3000
            assert run.status().state == "running"

            screen = app.screen
            await wait_for(
                pilot,
                lambda: (
                    screen.snapshot is not None  # type: ignore[attr-defined]
                    and sum(1 for r in screen.snapshot.state.ranks.values() if r.hello) == 2
                ),  # type: ignore[attr-defined]
                timeout=120,
                what="both ranks to say hello",
            )
            processes = run.processes()
            assert len(alive(processes)) >= 3, "the supervisor and two ranks run"
            ours = {p.pid for p in psutil.Process().children(recursive=True)}
            assert not ours & {pid for pid, _ in processes}, "the TUI has no child of the run to reap"

            await pilot.press("k")
            assert isinstance(app.screen, ConfirmScreen)
            await pilot.press("n")
            assert app.screen is screen and run.status().state == "running", "n keeps the run going"

            await pilot.press("k", "y")
            header = screen.query_one(RunHeader)
            await wait_for(
                pilot,
                lambda: header.info is not None and header.info.state == "stopped",
                timeout=60,
                what="the header to say stopped",
            )
            assert alive(processes) == [], "every process of the run ended"
            assert run.status().describe() == "stopped (SIGTERM)"
    finally:
        if run is not None and run.status().state == "running":
            stop(run, grace=2.0, out=lambda _line: None)
