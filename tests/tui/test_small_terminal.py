"""80×24 with many GPUs and many ranks: everything keeps one line per GPU or rank, and stays on screen."""

from __future__ import annotations

from pathlib import Path

from shardtop.tui.app import ShardtopApp
from shardtop.tui.screens.home import HomeScreen
from shardtop.tui.tree_columns import tree_columns
from shardtop.tui.widgets.gpu_bar import GpuBar
from shardtop.tui.widgets.process_table import ProcessTable
from shardtop.tui.widgets.rank_memory import RankMemory
from shardtop.tui.widgets.run_list import RunList
from shardtop.tui.widgets.shard_tree import ShardTree
from tests.support.recorded import (
    EIGHT_GPU_HOST,
    H200_HOST,
    RecordedHost,
    copy_runs,
    eight_h200_processes,
    eight_h200s,
    recorded_h200,
)
from tests.support.waiting import settled, wait_for


async def test_eight_gpus_at_80x24_keep_a_line_each_and_the_runs_on_screen(tmp_path: Path) -> None:
    runs = copy_runs(tmp_path / "runs", "h200/zero3-linear-fixed", "cpu-6ranks/zero3-linear", "cpu/fsdp2-mlp")
    host = RecordedHost(EIGHT_GPU_HOST, eight_h200_processes())
    app = ShardtopApp(tmp_path / "runs", gpu_source=eight_h200s(), host_probe=host)  # type: ignore[arg-type]
    async with app.run_test(size=(80, 24)) as pilot:
        screen = app.screen
        await wait_for(pilot, lambda: isinstance(screen, HomeScreen) and screen.gpus and screen.runs, what="data")
        await settled(pilot)
        bars = list(screen.query(GpuBar))
        assert len(bars) == 8 and all(b.region.height == 1 for b in bars), "one line per GPU"
        assert len({b.region.y for b in bars}) == 8
        processes, run_list = screen.query_one(ProcessTable), screen.query_one(RunList)
        assert processes.row_count == 7 and processes.region.height >= 5, "the header and three processes at least"
        assert processes.border_subtitle == "7 processes", "says how many when not all fit"
        assert run_list.row_count == len(runs) and run_list.region.bottom <= 23, "the runs stay above the footer"
        assert screen.has_class("-short", "-narrow")


async def test_six_ranks_at_80x24_fold_their_columns_and_keep_a_bar_each(tmp_path: Path) -> None:
    runs = copy_runs(tmp_path / "runs", "cpu-6ranks/zero3-linear")
    run = str(runs["cpu-6ranks/zero3-linear"])
    app = ShardtopApp(tmp_path / "runs", run=run, gpu_source=recorded_h200(), host_probe=RecordedHost(H200_HOST))  # type: ignore[arg-type]
    async with app.run_test(size=(80, 24)) as pilot:
        tree = app.screen.query_one(ShardTree)
        await wait_for(pilot, lambda: tree.model is not None, what="the tree")
        await pilot.press("down", "down", "enter")  # 96 Linear: the tree now scrolls
        await settled(pilot)
        ranks = app.screen.query_one(RankMemory)
        assert len(ranks.rows) == 6 and ranks.render().plain.count("\n") == 5, "one line per rank"
        cols = tree_columns(tree.scrollable_content_region.width, 6)
        assert cols.ranks_shown == 0 and cols.range, "six rank columns do not fit 80 columns: one min…max column"
        await pilot.resize_terminal(160, 48)
        await settled(pilot)
        cols = tree_columns(tree.scrollable_content_region.width, 6)
        assert cols.ranks_shown == 6 and cols.name >= 24, "at 160 columns, a column per rank"
