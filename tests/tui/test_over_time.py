"""Memory over time, stalled ranks, bars against the limit that applies, and what the ranks do before
the tree: on real CPU recordings (``tests/fixtures/runs/cpu-over-time/``), as the user sees them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from rich.style import Style
from rich.text import Text

from shardtop.read.memory_growth import Growth
from shardtop.read.rank_facts import RankStatus
from shardtop.tui.over_time import about, growth_words, over_time_line
from shardtop.tui.screens.run_view import RunScreen
from shardtop.tui.widgets.rank_memory import RankMemory
from shardtop.tui.widgets.run_header import RunHeader
from shardtop.tui.widgets.shard_tree import ShardTree
from tests.support.apps import run_app, run_ready
from tests.support.recorded import copy_runs, live_copy
from tests.support.waiting import settled, wait_for

GROWS = "cpu-over-time/keeps_outputs"
"""One rank whose loop keeps every step's outputs: 8 MiB more at every step's start."""
STALLED = "cpu-over-time/skips_collective"
"""Two gloo ranks: rank 0 waits in an all-reduce that rank 1 skipped (copied while it waited)."""
HOST_MEMORY = "of 23.5 GiB host memory"
"""The recording machine's RAM: the CPU ranks' bars measure against it."""


def first_moment(root: Path) -> Path:
    """The growth run live again, cut to its first moment: the rank said hello, no tree yet, one log line."""
    run = live_copy(root, GROWS)
    events = run / "events" / "rank-0.jsonl"
    events.write_text(events.read_text().splitlines()[0] + "\n")
    log = run / "logs" / "command-vm.log"
    log.write_text(log.read_text().splitlines()[0] + "\n")
    return run


async def memory_lines(pilot: Any, app: Any) -> list[str]:
    await wait_for(pilot, lambda: isinstance(app.screen, RunScreen) and app.screen.snapshot is not None, what="run")
    await settled(pilot)
    return app.screen.query_one(RankMemory).render().plain.splitlines()


def test_growth_is_said_with_the_step_and_time_it_runs_out() -> None:
    g = Growth(8 * 2**20, 3, 30, 186_000_000, 412_000_000, 0.08, 25_275_990_016)
    assert growth_words(g) == f"grows 8 MiB/step → out of memory at ~step {g.out_of_memory_step} (≈ 4 min)"
    assert growth_words(Growth(8 * 2**20, 3, 30, 1, 2, None, None)) == "grows 8 MiB/step"
    assert [about(s) for s in (40, 240, 7200, 3 * 86400)] == ["≈ 40 s", "≈ 4 min", "≈ 2 h", "≈ 3 days"]


async def test_memory_that_grows_every_step_is_drawn_and_said_under_its_bar(tmp_path: Path) -> None:
    run = copy_runs(tmp_path / "runs", GROWS)[GROWS]
    app = run_app(tmp_path / "runs", run)
    async with app.run_test(size=(160, 48)) as pilot:
        lines = await memory_lines(pilot, app)
        ranks = app.screen.query_one(RankMemory)
        assert ranks.border_title == f"Memory per rank, {HOST_MEMORY}"
        bar, steps = lines[0], lines[1]
        assert "█" not in bar, f"412 MiB of 23.5 GiB is no full bar: {bar!r}"
        g = app.screen.snapshot.model.growth[0]
        said = f" ↗ grows 8 MiB/step, OOM ~step {g.out_of_memory_step} ({about(g.seconds_left or 0)})"
        assert steps.endswith(said), steps
        assert steps.strip()[0] == "▁" and "█" in steps, "the per-step sparkline climbs from its lowest step"


def test_a_wide_panel_says_the_growth_in_full_beside_its_sparkline() -> None:
    g = Growth(8 * 2**20, 3, 30, 186_000_000, 412_000_000, 0.08, 25_275_990_016)
    out = Text()
    over_time_line(out, tuple(range(0, 30 * 2**23, 2**23)), g, RankStatus("running"), 120, "  ", lambda _: Style())
    line = out.plain.removeprefix("\n  ")
    assert line == "▁▁▁▂▂▂▃▃▃▄▄▄▅▅▅▆▆▆▇▇▇███ ↗ " + growth_words(g), line


async def test_a_stalled_rank_reads_stalled_not_running(tmp_path: Path) -> None:
    run = live_copy(tmp_path / "runs", STALLED)
    app = run_app(tmp_path / "runs", run)
    async with app.run_test(size=(160, 48)) as pilot:
        lines = await memory_lines(pilot, app)
        r0 = next(i for i, line in enumerate(lines) if line.startswith("r0"))
        assert "‖ stalled" in lines[r0], lines
        assert "‖ stalled: no progress for 4 s in backward of step 3" in lines[r0 + 1], lines
        r1 = next(line for line in lines if line.startswith("r1"))
        assert "stalled" not in r1
        header = app.screen.query_one(RunHeader).render().plain
        assert "‖ rank 0 stalled" in header, header


async def test_before_the_tree_the_pane_says_what_the_ranks_are_doing(tmp_path: Path) -> None:
    run = first_moment(tmp_path / "runs")
    app = run_app(tmp_path / "runs", run)
    async with app.run_test(size=(160, 48)) as pilot:
        await wait_for(pilot, lambda: isinstance(app.screen, RunScreen) and app.screen.snapshot is not None, what="run")
        await settled(pilot)
        tree = app.screen.query_one(ShardTree)
        text = "\n".join(tree.render_line(y).text.strip() for y in range(1, 12))
        assert "No module tree yet" in text
        assert "r0: running" in text, text
        assert "vm: last log line: shardtop: started" in text, text


@pytest.mark.parametrize("size", [pytest.param((80, 24), id="80x24"), pytest.param((160, 48), id="160x48")])
def test_run_view_of_memory_growing_every_step(snap_compare: Any, in_tmp: Path, size: tuple[int, int]) -> None:  # noqa: F811
    runs = copy_runs(in_tmp / "runs", GROWS)
    assert snap_compare(run_app(in_tmp / "runs", runs[GROWS]), terminal_size=size, run_before=run_ready())


@pytest.mark.parametrize("size", [pytest.param((80, 24), id="80x24"), pytest.param((160, 48), id="160x48")])
def test_run_view_of_a_stalled_rank(snap_compare: Any, in_tmp: Path, size: tuple[int, int]) -> None:  # noqa: F811
    run = live_copy(in_tmp / "runs", STALLED)
    assert snap_compare(run_app(in_tmp / "runs", run), terminal_size=size, run_before=run_ready())


def test_run_view_before_the_tree(snap_compare: Any, in_tmp: Path) -> None:  # noqa: F811
    run = first_moment(in_tmp / "runs")
    assert snap_compare(run_app(in_tmp / "runs", run), terminal_size=(80, 24), run_before=run_ready())


@pytest.mark.parametrize(
    ("name", "title"),
    [("h200/zero3-linear", "Memory per rank, of 15 GiB cap"), ("h200/fsdp2-mlp", "Memory per rank, of 140 GiB GPU")],
)
async def test_every_bar_measures_against_the_limit_that_applies_and_says_which(
    tmp_path: Path, name: str, title: str
) -> None:
    run = copy_runs(tmp_path / "runs", name)[name]
    app = run_app(tmp_path / "runs", run)
    async with app.run_test(size=(160, 48)) as pilot:
        await memory_lines(pilot, app)
        assert app.screen.query_one(RankMemory).border_title == title
