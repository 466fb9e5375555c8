"""ctrl+f in the launch prompt finds what fits for real: ``shardtop fit`` starts detached from the TUI, its
rehearsals come into the run list as runs, and its result lands in its own directory."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from shardtop.fit.detached import FITS_DIR, PROGRESS_LOG
from shardtop.rundir.run_directory import list_runs
from shardtop.tui.screens.home import HomeScreen
from tests.support.launch_prompt import app_at, open_prompt
from tests.support.waiting import wait_for, wait_until

SMALL = (80, 24)


@pytest.mark.timeout(300)
async def test_ctrl_f_finds_what_fits_while_the_tui_goes_on(tmp_path: Path) -> None:
    """On CPU, a budget that leaves room for one rehearsal: it is a run the home screen lists, and fit's
    result says so once it is done (the TUI is closed by then: fit does not need it)."""
    root = tmp_path / "runs"
    app = app_at(root)
    async with app.run_test(size=SMALL) as pilot:
        await open_prompt(app, pilot, "fsdp-auto-wrap")
        await pilot.press(*"devices=2 gpu=128MiB model.image=128 budget=1s", "ctrl+f")
        await wait_for(pilot, lambda: isinstance(app.screen, HomeScreen), what="the home screen again")
        fits = list((root / FITS_DIR).iterdir())
        assert len(fits) == 1, fits
        await wait_for(pilot, lambda: list_runs(root), timeout=60, what="the first rehearsal's run")
        (run,) = list_runs(root)
        home = app.screen
        assert isinstance(home, HomeScreen)
        await wait_for(pilot, lambda: home.runs is not None and any(r.summary.id == run.id for r in home.runs.rows),
                       timeout=30, what="the rehearsal in the run list")
    result = fits[0] / "fit.json"
    wait_until(result.exists, timeout=120, what="fit's result")
    data = json.loads(result.read_text())
    (setup,) = data["configurations"]
    assert data["rehearsals"] == 1 and setup["ending"] == "budget" and data["budget_spent"]
    assert setup["trials"][0]["run"] == run.id
    assert json.loads((run.path / "run.json").read_text())["config"]["model"]["image"] == 128
    assert "rehearsing micro-batch" in (fits[0] / PROGRESS_LOG).read_text()
