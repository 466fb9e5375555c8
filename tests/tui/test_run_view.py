"""The run view driven by keys: opening, folding, search, OOM jump, details, help, report."""

from __future__ import annotations

import sys
import types
from pathlib import Path

import pytest
from textual.widgets import Static, TabbedContent

from shardtop.read.shard_model import Fold
from shardtop.rundir.run_directory import RunDirectory
from shardtop.tui.app import ShardtopApp
from shardtop.tui.screens.help import HelpScreen
from shardtop.tui.screens.report_view import ReportScreen
from shardtop.tui.screens.run_view import RunScreen
from shardtop.tui.widgets.module_details import ModuleDetails
from shardtop.tui.widgets.oom_panel import OomPanel
from shardtop.tui.widgets.rank_memory import RankMemory
from shardtop.tui.widgets.run_header import RunHeader
from shardtop.tui.widgets.run_list import RunList
from shardtop.tui.widgets.shard_tree import ShardTree
from tests.support.apps import app_for, text_of
from tests.support.recorded import H200_HOST, RecordedHost, recorded_h200, recorded_run
from tests.support.waiting import wait_for

ZERO3 = recorded_run("h200/zero3-linear").name
"""Story 2 on the H200: 18 000 Linear, a real CUDA OOM in model.net.15330."""
ZERO3_FIXED = recorded_run("h200/zero3-linear-fixed").name
"""Story 2 fixed, on one H200: a real OOM under deepspeed.zero.Init, before any module tree."""
FSDP2 = recorded_run("cpu/fsdp2-mlp").name
CULPRIT = "model.net.15330"


def tree_of(app: ShardtopApp) -> ShardTree:
    return app.screen.query_one(ShardTree)


def selected_path(tree: ShardTree) -> str:
    node = tree.selected
    assert tree.model is not None and node is not None
    return tree.model.paths[node] if isinstance(node, int) else f"fold:{tree.model.fold_label(node)}"


async def test_enter_on_a_run_opens_it(recorded_root: Path) -> None:
    app = app_for(recorded_root)
    async with app.run_test(size=(120, 40)) as pilot:
        runs = app.screen.query_one(RunList)
        await wait_for(pilot, lambda: runs.row_count == 3, what="the run list")
        assert runs.selected() is not None and runs.selected().summary.id == ZERO3, "newest first"  # type: ignore[union-attr]
        await pilot.press("down")
        row = runs.selected()
        assert row is not None and row.summary.id == ZERO3_FIXED
        await pilot.press("up")
        row = runs.selected()
        assert row is not None and row.summary.id == ZERO3
        await pilot.press("enter")
        await wait_for(
            pilot, lambda: isinstance(app.screen, RunScreen) and tree_of(app).model is not None, what="the run view"
        )
        assert app.screen.run_dir.id == ZERO3  # type: ignore[attr-defined]
        header = app.screen.query_one(RunHeader).info
        assert header is not None and header.status == "failed (exit 1)" and header.phase == "setup"
        await pilot.press("escape")
        assert app.screen.query(RunList), "escape goes back to the home screen"


async def test_fold_and_unfold_18000_siblings(recorded_root: Path) -> None:
    app = app_for(recorded_root, run=ZERO3)
    async with app.run_test(size=(160, 48)) as pilot:
        tree = tree_of(app)
        await wait_for(pilot, lambda: tree.model is not None, what="the tree")
        await pilot.press("home")
        assert [selected_path(tree)] == [""]
        # the OOM opened the fold; close it from the last Linear with ←, then the fold line itself
        assert len(tree.lines) == 4 + 18000, "model, model, net, the fold, and its 18000 Linear"
        await pilot.press("end", "left")
        assert selected_path(tree) == "fold:0 … 17999"
        await pilot.press("enter")
        assert len(tree.lines) == 4, "the fold closed"
        await pilot.press("enter")
        assert len(tree.lines) == 4 + 18000
        await pilot.press("down")
        assert selected_path(tree) == "model.net.0"
        await pilot.press("left", "left")
        assert selected_path(tree) == "fold:0 … 17999" and len(tree.lines) == 4
        await pilot.press("left")
        assert selected_path(tree) == "model.net"
        assert tree.border_title == "Shard tree · model.net", "the title says where the cursor is"


async def test_search_finds_and_steps_through_modules(recorded_root: Path) -> None:
    app = app_for(recorded_root, run=ZERO3)
    async with app.run_test(size=(160, 48)) as pilot:
        tree = tree_of(app)
        await wait_for(pilot, lambda: tree.model is not None, what="the tree")
        await pilot.press("slash", *"net.12", "enter")
        assert tree.match_count == 1 + 10 + 100 + 1000, "net.12, net.120…129, net.1200…1299, net.12000…12999"
        assert selected_path(tree) == "model.net.12"
        assert tree.has_focus, "Enter hands the keys back to the tree"
        await pilot.press("n")
        assert selected_path(tree) == "model.net.120"
        await pilot.press("N", "N")
        assert selected_path(tree).startswith("model.net.12")
        await pilot.press("slash", "escape")
        assert tree.has_focus


async def test_oom_opens_the_tree_at_the_culprit_and_o_jumps_back(recorded_root: Path) -> None:
    app = app_for(recorded_root, run=ZERO3)
    async with app.run_test(size=(160, 48)) as pilot:
        tree = tree_of(app)
        await wait_for(pilot, lambda: tree.model is not None, what="the tree")
        await pilot.pause()
        assert selected_path(tree) == CULPRIT
        tabs = app.screen.query_one(TabbedContent)
        assert tabs.active == "oom"
        panel = app.screen.query_one(OomPanel)
        assert panel.oom is not None and panel.oom.rank == 0
        report = text_of(panel.query_one("#oom-text", Static))
        for words in (
            "OUT OF MEMORY",
            f"{CULPRIT} (Linear)",
            "DeepSpeedEngine._configure_distributed_model",
            "2 MiB",
            "GPU0",
            "CUDA out of memory. Tried to allocate 2.00 MiB",
        ):
            assert words in report, words
        snapshot = app.screen.snapshot  # type: ignore[attr-defined]
        explained = [f for f in snapshot.findings if f.severity == "error"]
        assert explained and "Why" in report and explained[0].title in " ".join(report.split())
        ranks = app.screen.query_one(RankMemory)
        row = ranks.rows[0]
        assert row.status.state == "out of memory" and row.allocated == panel.oom.oom.allocated, (
            "the bar ends at the OOM"
        )
        await pilot.press("home", "m")
        assert selected_path(tree) == "" and tabs.active == "module"
        await pilot.press("o")
        assert selected_path(tree) == CULPRIT and tabs.active == "oom"
        details = text_of(app.screen.query_one(ModuleDetails).query_one("#details-text", Static))
        assert CULPRIT in details and "✗ OOM" in details


async def test_an_oom_under_zero_init_says_what_was_built_without_a_tree(recorded_root: Path) -> None:
    said: list[str] = []

    class Listening(ShardtopApp):
        def notify(self, message: str, **kwargs: object) -> None:  # type: ignore[override]
            said.append(message)
            super().notify(message, **kwargs)  # type: ignore[arg-type]

    host = RecordedHost(H200_HOST)
    app = Listening(recorded_root, run=ZERO3_FIXED, gpu_source=recorded_h200(), host_probe=host)  # type: ignore[arg-type]
    async with app.run_test(size=(160, 48)) as pilot:
        screen = app.screen
        await wait_for(pilot, lambda: getattr(screen, "snapshot", None) is not None, what="the run")
        await pilot.pause()
        tree = tree_of(app)
        assert tree.model is None and screen.has_class("-treeless"), "no tree: the OOM gets the room"
        assert "deepspeed.zero.Init" in tree.empty_words
        tabs = screen.query_one(TabbedContent)
        assert tabs.active == "oom"
        report = " ".join(text_of(screen.query_one(OomPanel).query_one("#oom-text", Static)).split())
        assert "module not known: a Linear being built under deepspeed.zero.Init" in report
        assert "engine step Init._partition_param" in report
        await pilot.press("m", "o")
        assert tabs.active == "oom"
        assert any("names no module path" in m and "Init._partition_param" in m for m in said), said


async def test_details_of_a_real_fsdp2_module(recorded_root: Path) -> None:
    app = app_for(recorded_root, run=FSDP2)
    async with app.run_test(size=(160, 48)) as pilot:
        tree = tree_of(app)
        await wait_for(pilot, lambda: tree.model is not None, what="the tree")
        await pilot.press("slash", *"blocks.3.fc1", "enter")
        assert selected_path(tree) == "model.blocks.3.fc1"
        await pilot.pause()
        details = app.screen.query_one(ModuleDetails)
        words = text_of(details.query_one("#details-text", Static))
        assert "model.blocks.3.fc1" in words and "sharded" in words and "fsdp2 unit" in words
        model = tree.model
        assert model is not None and model.ranks == (0, 1)
        node = tree.selected
        assert isinstance(node, int) and not isinstance(node, Fold)
        cells = model.rank_cells(node)
        assert {c.state for c in cells} == {"sharded"} and all(c.unit is not None for c in cells)
        header = app.screen.query_one(RunHeader).info
        assert header is not None and header.engine == "fsdp2" and "finished" in header.status


async def test_narrow_terminal_switches_layout(recorded_root: Path) -> None:
    app = app_for(recorded_root, run=ZERO3)
    async with app.run_test(size=(80, 24)) as pilot:
        await wait_for(pilot, lambda: tree_of(app).model is not None, what="the tree")
        assert app.screen.has_class("-narrow")
        await pilot.resize_terminal(160, 48)
        await pilot.pause()
        assert not app.screen.has_class("-narrow")


async def test_help_lists_the_keys(recorded_root: Path) -> None:
    app = app_for(recorded_root, run=ZERO3)
    async with app.run_test(size=(100, 40)) as pilot:
        await pilot.press("question_mark")
        assert isinstance(app.screen, HelpScreen)
        words = " ".join(text_of(s) for s in app.screen.query(Static))
        said = ("Go to the module where a rank ran out of memory", "Find modules", "Stop this run", "the runs go on")
        for key in (*said, "✗ OOM"):
            assert key in words, key
        await pilot.press("escape")
        assert isinstance(app.screen, RunScreen)


@pytest.mark.parametrize("read_only", [False, True])
async def test_report_key_saves_markdown_unless_read_only(
    recorded_root: Path, monkeypatch: pytest.MonkeyPatch, read_only: bool
) -> None:
    calls: list[tuple[str, str]] = []

    def render_report(run: RunDirectory, fmt: str) -> str:
        calls.append((run.id, fmt))
        return f"# shardtop report: {run.id}\n"

    monkeypatch.setitem(sys.modules, "shardtop.report", types.SimpleNamespace(render_report=render_report))
    app = app_for(recorded_root, run=ZERO3, read_only=read_only)
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.press("r")
        await wait_for(pilot, lambda: isinstance(app.screen, ReportScreen), what="the report")
        assert calls == [(ZERO3, "markdown")]
        saved = recorded_root / ZERO3 / "report.md"
        assert saved.exists() is not read_only
        if not read_only:
            assert saved.read_text().startswith("# shardtop report")


async def test_report_key_without_the_report_module_says_so(
    recorded_root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "shardtop.report", None)  # import fails as if not written yet
    said: list[str] = []

    class Listening(ShardtopApp):
        def notify(self, message: str, **kwargs: object) -> None:  # type: ignore[override]
            said.append(message)
            super().notify(message, **kwargs)  # type: ignore[arg-type]

    app = Listening(recorded_root, run=ZERO3)
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.press("r")
        await wait_for(pilot, lambda: any(m.startswith("No report") for m in said), what="the notification")
        assert isinstance(app.screen, RunScreen)
        assert not (recorded_root / ZERO3 / "report.md").exists()


async def test_mouse_click_opens_a_module_and_selects_a_line(recorded_root: Path) -> None:
    app = app_for(recorded_root, run=FSDP2)
    async with app.run_test(size=(120, 40)) as pilot:
        tree = tree_of(app)
        await wait_for(pilot, lambda: tree.model is not None, what="the tree")
        assert len(tree.lines) == 5, "the model, its one child, and that child's embed, blocks, head"
        # offsets count the border: content row 0 is the column header, then the lines; "▶" after the "  ├─" guide
        await pilot.click(ShardTree, offset=(5, 5))
        assert selected_path(tree) == "model.blocks" and len(tree.lines) == 6, "blocks opened: one fold of 8 Block"
        await pilot.click(ShardTree, offset=(12, 6))
        assert selected_path(tree) == "fold:0 … 7"


async def test_report_key_with_the_real_report(recorded_root: Path) -> None:
    app = app_for(recorded_root, run=ZERO3)
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.press("r")
        await wait_for(pilot, lambda: isinstance(app.screen, ReportScreen), timeout=20, what="the report")
        saved = (recorded_root / ZERO3 / "report.md").read_text()
        assert saved.startswith("# shardtop report") and "net.15330" in saved
        await pilot.press("escape")
        assert isinstance(app.screen, RunScreen)
