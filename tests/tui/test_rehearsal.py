"""A rehearsal in the TUI, on the real CPU rehearsals (``tests/fixtures/runs/cpu-rehearsal``): the run
view and the run list say what was rehearsed, in words; the launch prompt offers a rehearsal where
``devices=`` asks for more than this machine has (tests/engines/test_tui_rehearse.py starts one)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from textual.widgets import Input, Static

from shardtop.config import ConfigError
from shardtop.launch import TooManyDevices
from shardtop.rundir.run_directory import list_runs
from shardtop.tui.app import ShardtopApp
from shardtop.tui.screens.home import HomeScreen
from shardtop.tui.screens.launch_prompt import check_launch, offered_rehearsal
from shardtop.tui.screens.run_view import RunScreen
from shardtop.tui.widgets.findings_list import FindingsList
from shardtop.tui.widgets.rank_memory import RankMemory
from shardtop.tui.widgets.run_header import RunHeader
from shardtop.tui.widgets.run_list import RunList, run_cells
from tests.support.launch_prompt import gpu_prompt, open_prompt
from tests.support.recorded import H200_HOST, RecordedHost, copy_runs, recorded_h200
from tests.support.waiting import settled, wait_for

REHEARSED = "cpu-rehearsal/zero3-linear"
"""Story 2 as asked, ranks 0 and 3 of a 4-rank job rehearsed one after the other on CPU."""
HEADLINE = "ranks 0, 3 of 4, rehearsed on CPU; collectives not run"
SMALL = (80, 24)


def app_at(root: Path, run: Path | None = None, refresh: float = 3600.0) -> ShardtopApp:
    return ShardtopApp(
        root, run=str(run) if run else None, refresh=refresh,
        gpu_source=recorded_h200(), host_probe=RecordedHost(H200_HOST),  # type: ignore[arg-type]
    )


async def test_the_run_view_says_what_was_rehearsed_and_what_it_cannot_show(tmp_path: Path) -> None:
    runs = copy_runs(tmp_path / "runs", REHEARSED)
    app = app_at(tmp_path / "runs", runs[REHEARSED])
    async with app.run_test(size=SMALL) as pilot:
        await wait_for(pilot, lambda: isinstance(app.screen, RunScreen) and app.screen.snapshot is not None,
                       what="the run view")
        screen = app.screen
        header = screen.query_one(RunHeader).info
        assert header is not None and header.rehearsal and header.ranks == HEADLINE
        assert header.status == "finished", "the status stays the run's, word for word"
        assert [r.rank for r in screen.query_one(RankMemory).rows] == [0, 3]
        findings = str(screen.query_one(FindingsList).query_one("#findings-text", Static).content)
        assert findings.startswith("⚠ Rehearsed through a fake process group")
        assert findings.count("fake process group") == 1 and "ranks not rehearsed were not run" in findings
        assert "each of the 2 rehearsed ranks (of 4)" in findings


async def test_a_real_run_view_says_nothing_of_rehearsals(tmp_path: Path) -> None:
    runs = copy_runs(tmp_path / "runs", "cpu-6ranks/zero3-linear")
    app = app_at(tmp_path / "runs", runs["cpu-6ranks/zero3-linear"])
    async with app.run_test(size=SMALL) as pilot:
        await wait_for(pilot, lambda: isinstance(app.screen, RunScreen) and app.screen.snapshot is not None,
                       what="the run view")
        header = app.screen.query_one(RunHeader).info
        assert header is not None and not header.rehearsal and header.ranks == "6 ranks on vm"
        findings = str(app.screen.query_one(FindingsList).query_one("#findings-text", Static).content)
        assert "rehears" not in findings


async def test_the_run_list_marks_a_rehearsal_in_words(tmp_path: Path) -> None:
    runs = copy_runs(tmp_path / "runs", REHEARSED, "cpu-6ranks/zero3-linear")
    app = app_at(tmp_path / "runs")
    async with app.run_test(size=SMALL) as pilot:
        await wait_for(pilot, lambda: isinstance(app.screen, HomeScreen) and app.screen.runs is not None,
                       what="the run list")
        await settled(pilot)
        home = app.screen
        assert isinstance(home, HomeScreen) and home.runs is not None
        rows = {r.summary.id: r for r in home.runs.rows}
        rehearsal = run_cells(rows[runs[REHEARSED].name])
        assert (str(rehearsal[1]), rehearsal[2]) == ("✓ rehearsal finished", "2/4")
        real = run_cells(rows[runs["cpu-6ranks/zero3-linear"].name])
        assert (str(real[1]), real[2]) == ("✓ finished", "6")
        assert app.screen.query_one(RunList).row_count == 2


def test_more_devices_than_the_machine_has_offer_their_rehearsal() -> None:
    try:
        check_launch("fsdp2-mlp", "devices=64 max_steps=3", lambda: 2)
    except ConfigError as e:
        refused = e
    assert isinstance(refused, TooManyDevices) and refused.accelerator == "cuda"
    offered = offered_rehearsal("fsdp2-mlp", "devices=64 max_steps=3", refused)
    assert offered is not None and offered.settings == ("fsdp2-mlp", "devices=64", "max_steps=3")
    assert offered.words == "rehearse the 64-GPU job on this machine's first GPU, one rank at a time"
    assert offered.command == "shardtop rehearse fsdp2-mlp devices=64 max_steps=3"
    try:  # a preset that drives every GPU from one process has no rank to rehearse
        check_launch("manual-placement", "devices=64", lambda: 2)
    except ConfigError as e:
        assert offered_rehearsal("manual-placement", "devices=64", e) is None
    try:
        check_launch("fsdp2-mlp", "max_steps=lots", lambda: 2)
    except ConfigError as e:
        assert offered_rehearsal("fsdp2-mlp", "max_steps=lots", e) is None


async def test_the_prompt_leaves_what_fits_to_enter(tmp_path: Path) -> None:
    app = app_at(tmp_path / "runs")
    async with app.run_test(size=SMALL) as pilot:
        prompt = await open_prompt(app, pilot, "fsdp2-mlp")
        await pilot.press(*"max_steps=2")
        await pilot.press("ctrl+r")
        assert app.screen is prompt and prompt.query_one("#overrides", Input).value == "max_steps=2"
        assert str(prompt.query_one("#launch-command", Static).content).startswith("Enter runs: shardtop launch")
        assert list_runs(tmp_path / "runs") == []


def test_the_offer_at_80x24(snap_compare: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """On a machine with two H200s, devices=8: the refusal, and the rehearsal ctrl+r would start instead."""
    monkeypatch.chdir(tmp_path)
    app = ShardtopApp(
        tmp_path / "runs", refresh=3600.0, gpu_source=recorded_h200(),  # type: ignore[arg-type]
        host_probe=RecordedHost(H200_HOST), clock=lambda: 1795966800.0,  # type: ignore[arg-type]
    )

    async def run_before(pilot: Any) -> None:
        prompt = await gpu_prompt(pilot.app, pilot, "fsdp2-mlp")
        prompt.query_one(Input).cursor_blink = False
        await pilot.press(*"devices=8 max_steps=3", "enter")
        await settled(pilot)
        offer = str(prompt.query_one("#launch-command", Static).content)
        assert offer == (
            "ctrl+r: rehearse the 8-GPU job on this machine's first GPU, one rank at a time instead: "
            "shardtop rehearse fsdp2-mlp devices=8 max_steps=3"
        )

    assert snap_compare(app, terminal_size=SMALL, run_before=run_before)
