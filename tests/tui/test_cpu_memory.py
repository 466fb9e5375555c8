"""A CPU rank's memory bar: its resident memory against its host's, moving as it grows; the cap on CPU said
as what it caps; every glyph a bar draws named in the help."""

from __future__ import annotations

from pathlib import Path

from textual.widgets import Static

from shardtop.read.whole_run import read_run
from shardtop.rundir.run_directory import RunDirectory
from shardtop.tui.app import ShardtopApp
from shardtop.tui.format import BAR_EIGHTHS, BAR_EMPTY, BAR_FULL, BAR_RESERVED, SPARKS
from shardtop.tui.memory_bar import GLYPHS, PEAK
from shardtop.tui.run_frame import memory_lines
from shardtop.tui.screens.help import HelpScreen
from shardtop.tui.widgets.oom_panel import OomPanel
from shardtop.tui.widgets.plan_bars import FREE, LIMIT, PART_MARKS
from shardtop.tui.widgets.rank_memory import RankMemory
from tests.support.apps import run_app, run_ready, text_of
from tests.support.first_minutes import CPU_OOM_DATA_SEGMENT, MIB, append_memory, copy_first_minutes, live_head
from tests.support.recorded import H200_HOST, RecordedHost, copy_runs, recorded_h200
from tests.support.waiting import settled, wait_for


def rank_line(panel: RankMemory, rank: int) -> str:
    return next(line for line in panel.render().plain.splitlines() if line.startswith(f"r{rank} "))  # type: ignore[union-attr]


def eighths(line: str) -> int:
    """How far a bar is filled, in eighths of a cell."""
    full = line.count(BAR_FULL)
    part = next((BAR_EIGHTHS.index(c) + 1 for c in line if c in BAR_EIGHTHS), 0)
    return full * 8 + part


async def test_a_cpu_ranks_bar_moves_as_its_memory_grows(in_tmp: Path) -> None:
    """523 MiB, then 1.05 GiB resident, of the host's 23.5 GiB: the bar twice as long, the figure with it."""
    run = live_head(in_tmp / "runs", CPU_OOM_DATA_SEGMENT, until="oom")
    app = ShardtopApp(in_tmp / "runs", run=str(run), refresh=0.1, gpu_source=recorded_h200(),  # type: ignore[arg-type]
                      host_probe=RecordedHost(H200_HOST))  # type: ignore[arg-type]
    async with app.run_test(size=(160, 48)) as pilot:
        panel = app.screen.query_one(RankMemory)
        append_memory(run, 0, 523 * MIB)
        await wait_for(pilot, lambda: "rss 523M/23.5G" in rank_line(panel, 0), what="523 MiB of 23.5 GiB")
        assert panel.border_title == "Memory per rank, of 23.5 GiB host memory", "rss, against memory of its kind"
        before = eighths(rank_line(panel, 0))
        append_memory(run, 0, 1075 * MIB)
        await wait_for(pilot, lambda: "rss 1.05G/23.5G" in rank_line(panel, 0), what="1.05 GiB of 23.5 GiB")
        after = eighths(rank_line(panel, 0))
        assert 0 < before < after, "the bar grows with the memory"
        assert abs(after - 2 * before) <= 1, "in proportion, to the eighth of a cell"


async def test_the_cap_on_cpu_is_said_as_what_it_caps(in_tmp: Path) -> None:
    """Story 2 out of memory under gpu_mem_limit=150MiB on CPU: the bars are rss of the host's memory, and
    the cap is told as what it limits, the data segment, at 160×48 and at 80×24."""
    run = copy_first_minutes(in_tmp / "runs", CPU_OOM_DATA_SEGMENT)
    app = run_app(in_tmp / "runs", run)
    async with app.run_test(size=(160, 48)) as pilot:
        await run_ready()(pilot)
        panel = app.screen.query_one(RankMemory)
        text = panel.render().plain  # type: ignore[union-attr]
        assert panel.border_title == "Memory per rank, of 23.5 GiB host memory"
        assert "rss 460M/23.5G" in rank_line(panel, 0) and "OOM" in rank_line(panel, 0)
        assert "capped: +150 MiB data segment (RLIMIT_DATA), not rss" in text
        oom = " ".join(text_of(app.screen.query_one(OomPanel).query_one("#oom-text", Static)).split())
        assert "cap +150 MiB data segment (RLIMIT_DATA) from the rank's start" in oom, "the OOM tab says it alike"
        assert "_configure_distributed_model, under a cap of 150 MiB more data segment (RLIMIT_DATA)" in oom
        assert "limit" not in oom, "the cap on CPU is not a limit on the memory the bars show"
        await pilot.resize_terminal(80, 24)
        await settled(pilot)
        assert panel.border_title == "Memory of 23.5G host RAM"
        assert panel.render().plain.count("cap +150M data segment") == 2  # type: ignore[union-attr]


async def test_the_help_names_every_glyph_the_bars_draw(in_tmp: Path) -> None:
    """Whatever a bar draws, the help says what it means, and the run view's unexplained memory is not drawn
    like the plan's gradients."""
    runs = copy_runs(in_tmp / "runs", "h200-split/zero3-linear-fixed", "h200-split/fsdp-auto-wrap")
    copy_first_minutes(in_tmp / "runs", CPU_OOM_DATA_SEGMENT)
    drawn: set[str] = set()
    for run in (*runs.values(), in_tmp / "runs" / CPU_OOM_DATA_SEGMENT):
        app = run_app(in_tmp / "runs", run)
        async with app.run_test(size=(160, 48)) as pilot:
            await run_ready()(pilot)
            drawn |= {c for c in app.screen.query_one(RankMemory).render().plain if "\u2500" <= c <= "\u25ff"}  # type: ignore[union-attr]
            await pilot.press("question_mark")
            await wait_for(pilot, lambda a=app: isinstance(a.screen, HelpScreen), what="the help")  # type: ignore[misc]
            help_text = "".join(text_of(s) for s in app.screen.query(Static))
    every = {BAR_FULL, BAR_RESERVED, BAR_EMPTY, *BAR_EIGHTHS, *SPARKS, *GLYPHS.values(), PEAK, *PART_MARKS, FREE, LIMIT}
    assert drawn <= every, "the glyphs drawn are the ones the code names"
    assert {BAR_FULL, BAR_EMPTY, GLYPHS["unexplained"], PEAK} <= drawn, "the stacked bars and the CPU's were drawn"
    missing = sorted(g for g in every if g not in help_text)
    assert not missing, f"the help does not say what {missing} mean"
    assert GLYPHS["unexplained"] not in PART_MARKS, "unexplained memory and the plan's gradients look different"


async def test_without_the_hosts_memory_the_bars_are_against_the_highest_rss_and_say_so(in_tmp: Path) -> None:
    """A recording from before ranks said their host's memory: six CPU ranks, each bar of the fullest's rss."""
    runs = copy_runs(in_tmp / "runs", "cpu-6ranks/zero3-linear")
    app = run_app(in_tmp / "runs", runs["cpu-6ranks/zero3-linear"])
    async with app.run_test(size=(160, 48)) as pilot:
        await run_ready()(pilot)
        panel = app.screen.query_one(RankMemory)
        assert panel.border_title == "Memory per rank, of the highest rss"
        fullest = rank_line(panel, 5)
        assert "rss 888M" in fullest and BAR_EMPTY not in fullest, "the highest fills its bar"
        assert BAR_EMPTY in rank_line(panel, 3) or any(c in rank_line(panel, 3) for c in BAR_EIGHTHS)


def test_attachs_first_frame_says_a_cpu_ranks_memory_as_the_run_view_does(in_tmp: Path) -> None:
    """The plain frame ``attach`` draws before the view: rss of the host's memory, in the same words."""
    run = copy_first_minutes(in_tmp / "runs", CPU_OOM_DATA_SEGMENT)
    lines = memory_lines(read_run(RunDirectory(run)))
    assert [line.split("  ")[0] for line in lines] == [" r0 cpu ✗ OOM", " r1 cpu ✗ OOM"]
    assert lines[0].endswith(" rss 460 MiB / 23.5 GiB") and lines[1].endswith(" rss 420 MiB / 23.5 GiB")
    assert 0 < eighths(lines[1]) < eighths(lines[0]) < 8, "a bar that moves by the eighth of a cell"
