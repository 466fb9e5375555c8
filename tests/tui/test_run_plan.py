"""The run view's Plan tab: the plan the run wrote at set-up, against what each rank measured."""

from __future__ import annotations

from pathlib import Path

from textual.widgets import TabbedContent

from shardtop.tui.widgets.plan_check import PlanVsRun
from tests.support.apps import app_for, text_of
from tests.support.recorded import copy_runs
from tests.support.waiting import wait_for


async def test_a_run_with_a_plan_shows_it_and_marks_a_miss(tmp_path: Path) -> None:
    """manual-placement on the H200, with the plan its rank 0 wrote at set-up (no convolution workspace
    counted): 15 % above the plan, said in words."""
    runs = copy_runs(tmp_path / "runs", "h200-over-time/manual-placement")
    app = app_for(tmp_path / "runs", str(runs["h200-over-time/manual-placement"]))
    async with app.run_test(size=(80, 24)) as pilot:
        await wait_for(pilot, lambda: getattr(app.screen, "snapshot", None) is not None, what="the run view")
        tabs = app.screen.query_one(TabbedContent)
        await wait_for(pilot, lambda: tabs.get_tab("plan").display, what="the Plan tab")
        assert str(tabs.get_tab("plan").label) == "✗ Plan"
        await pilot.press("p")
        assert tabs.active == "plan"
        words = text_of(app.screen.query_one("#plan-text"))  # type: ignore[arg-type]
        assert "Planned at set-up: manual placement, fp32; batch 2; fits H200" in words
        assert "r0  peak 1.27G/1.51G  -15 % ✗ missed" in words
        assert "params 403M/403M" in words
        assert app.screen.query_one(PlanVsRun).region.height > 0


async def test_a_run_without_a_plan_has_no_plan_tab(tmp_path: Path) -> None:
    runs = copy_runs(tmp_path / "runs", "cpu/fsdp2-mlp")
    app = app_for(tmp_path / "runs", str(runs["cpu/fsdp2-mlp"]))
    async with app.run_test(size=(80, 24)) as pilot:
        await wait_for(pilot, lambda: getattr(app.screen, "snapshot", None) is not None, what="the run view")
        tabs = app.screen.query_one(TabbedContent)
        assert not tabs.get_tab("plan").display
        await pilot.press("p")
        assert tabs.active != "plan"
