"""A rehearsal started from the launch prompt, where ``devices=`` asks for more than this machine has:
rank 0 of the job as a real CPU process, and its run opened in the TUI."""

from __future__ import annotations

from pathlib import Path

import pytest
from textual.widgets import Static

from shardtop.launch import cpu_room, stop
from shardtop.rundir.run_directory import RunDirectory, list_runs
from shardtop.tui.app import ShardtopApp
from shardtop.tui.screens.run_view import RunScreen
from shardtop.tui.widgets.run_header import RunHeader
from tests.support.launch_prompt import fully_shown, open_prompt
from tests.support.recorded import H200_HOST, RecordedHost, recorded_h200
from tests.support.waiting import wait_for

SMALL = (80, 24)


def app_at(root: Path, refresh: float) -> ShardtopApp:
    return ShardtopApp(
        root, refresh=refresh, gpu_source=recorded_h200(), host_probe=RecordedHost(H200_HOST),  # type: ignore[arg-type]
    )


@pytest.mark.timeout(300)
async def test_the_prompt_rehearses_what_this_machine_cannot_launch(tmp_path: Path) -> None:
    """On CPU: one process more than the machine holds. Enter refuses and offers the rehearsal, readable
    at 80×24; ctrl+r starts it (rank 0 of the job, a real CPU process) and opens its run."""
    root = tmp_path / "runs"
    devices = cpu_room().ranks + 1
    app = app_at(root, refresh=0.5)
    run: RunDirectory | None = None
    try:
        async with app.run_test(size=SMALL) as pilot:
            prompt = await open_prompt(app, pilot, "fsdp2-mlp")
            await pilot.press("ctrl+r")
            assert app.screen is prompt and list_runs(root) == [], "nothing to rehearse yet: nothing starts"
            await pilot.press(*f"devices={devices} max_steps=2", "enter")
            error = prompt.query_one("#launch-error", Static)
            offer = prompt.query_one("#launch-command", Static)
            assert f"devices={devices} on CPU" in str(error.content) and app.screen is prompt
            words = str(offer.content)
            assert words == (
                f"ctrl+r: rehearse the {devices}-rank job as one CPU process at a time instead: "
                f"shardtop rehearse fsdp2-mlp devices={devices} max_steps=2"
            )
            assert fully_shown(error, SMALL) and fully_shown(offer, SMALL), (error.region, offer.region)
            assert list_runs(root) == []
            await pilot.press("ctrl+r")
            await wait_for(pilot, lambda: isinstance(app.screen, RunScreen), timeout=30, what="the rehearsal's run")
            run = app.screen.run_dir  # type: ignore[attr-defined]
            assert run is not None
            meta = run.read_meta()
            rehearsal = meta.config.rehearsal
            assert rehearsal is not None and rehearsal.world_size == devices and rehearsal.ranks == (0,)
            assert meta.command[:2] == ("shardtop", "rehearse") and meta.config.settings["max_steps"] == 2
            header = app.screen.query_one(RunHeader)
            await wait_for(pilot, lambda: header.info is not None and header.info.rehearsal, what="the header")
            assert header.info is not None and header.info.ranks.startswith(f"rank 0 of {devices}, rehearsed on CPU")
    finally:
        if run is not None and run.status().state == "running":
            stop(run, grace=2.0, out=lambda _line: None)
