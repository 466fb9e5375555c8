"""What the run view says fills a rank's memory: the stacked bars, the tree's columns by kind, the OOM panel.

On two real H200 recordings with the probe's split by kind
(``tests/fixtures/runs/h200-split/``): zero3-linear-fixed under a 15 GiB cap,
which runs out of memory at set-up in ``_configure_zero_optimizer`` after a
peak of 11.7 GiB (7.83 GiB optimizer state, 3.91 GiB parameters), and
fsdp-auto-wrap, which finishes using 2.96 GiB of the 140 GiB GPU at its peak.
The layouts of several ranks are checked on copies of the set-up OOM's rank 0
as ranks 1…n (the recording has one rank; the kinds and sizes are its own).
"""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest
from rich.text import Text
from textual.widgets import Static

from shardtop.rundir.event_files import event_file, read_all
from shardtop.rundir.event_lines import encode
from shardtop.rundir.events import Hello
from shardtop.tui.app import ShardtopApp
from shardtop.tui.memory_bar import GLYPHS, PEAK
from shardtop.tui.screens.run_view import RunScreen
from shardtop.tui.widgets.oom_panel import OomPanel
from shardtop.tui.widgets.rank_memory import RankMemory
from shardtop.tui.widgets.shard_tree import ShardTree
from tests.support.apps import app_for, text_of
from tests.support.recorded import copy_runs
from tests.support.waiting import settled, wait_for

SETUP_OOM = "h200-split/zero3-linear-fixed"
FINISHED = "h200-split/fsdp-auto-wrap"
GIB = 1 << 30


async def opened(pilot: object, app: ShardtopApp) -> RunScreen:
    await wait_for(
        pilot,
        lambda: isinstance(app.screen, RunScreen)
        and app.screen.snapshot is not None
        and app.screen.query_one(ShardTree).model is not None,
        what="the run view with its tree",
    )
    await settled(pilot)
    assert isinstance(app.screen, RunScreen)
    return app.screen


def bar_of(line: str) -> str:
    """The bar's cells in a line of the panel: from its first bar glyph to its last."""
    glyphs = "█" + "".join(GLYPHS.values()) + PEAK
    start = next(i for i, ch in enumerate(line) if ch in glyphs)
    end = max(i for i, ch in enumerate(line) if ch in glyphs)
    return line[start : end + 1]


def runs_of(bar: str) -> str:
    """``█▪█▒▏░``: each run of one glyph once."""
    return "".join(ch for i, ch in enumerate(bar) if i == 0 or bar[i - 1] != ch)


def words_of(widget: Static) -> str:
    """What a Static shows, its whitespace runs as single spaces."""
    return " ".join(text_of(widget).split())


@pytest.mark.parametrize("size", [(160, 48), (80, 24)], ids=["160x48", "80x24"])
async def test_the_bar_of_a_setup_oom_stacks_its_kinds_and_marks_the_peak(
    tmp_path: Path, size: tuple[int, int]
) -> None:
    runs = copy_runs(tmp_path / "runs", SETUP_OOM)
    app = app_for(tmp_path / "runs", str(runs[SETUP_OOM]))
    async with app.run_test(size=size) as pilot:
        screen = await opened(pilot, app)
        panel = screen.query_one(RankMemory)
        text = panel.render()
        lines = text.plain.splitlines()
        bar = bar_of(lines[1])
        assert runs_of(bar) == "█▒" + PEAK + "▚░", "parameters, optimizer, comm; cache; the peak in outside PyTorch"
        at = bar.index(PEAK)
        assert at / len(bar) <= 11.74 / 15 < (at + 1) / len(bar), "the peak, 11.7 of the 15 GiB limit, along the bar"
        if size == (160, 48):
            assert lines[2].strip() == "█param 3.91G █optim 3.91G ▒cache 3.17G ▚outside 1.14G +1"
            assert lines[3].strip() == f"alloc 8.57G · resv 11.7G · {PEAK}peak 11.7G of 15.0G limit"
        else:
            assert [line.strip() for line in lines[2:4]] == [
                "█param 3.91G █optim 3.91G", f"▒cache 3.17G {PEAK}peak 11.7G…"
            ]
        # each kind in its own colour: a cell of parameters, optimizer state, comm buffers, cache, outside
        start = text.plain.index(bar)
        filled = bar.index("▒")
        cells = [0, filled // 2, filled - 1, filled, bar.index("▚")]
        colours = [text.get_style_at_offset(app.console, start + i).color for i in cells]
        assert None not in colours and len(set(colours)) == 5, colours


async def test_the_oom_panel_says_what_filled_memory_at_the_peak_and_at_the_oom(tmp_path: Path) -> None:
    runs = copy_runs(tmp_path / "runs", SETUP_OOM)
    app = app_for(tmp_path / "runs", str(runs[SETUP_OOM]))
    async with app.run_test(size=(120, 40)) as pilot:
        screen = await opened(pilot, app)
        words = words_of(screen.query_one(OomPanel).query_one("#oom-text", Static))
        peak = "at the peak (step 0, setup) 11.7 GiB allocated: 7.83 GiB optimizer state, 3.91 GiB parameters"
        oom = (
            "at the OOM 8.57 GiB allocated: 3.91 GiB parameters, 3.91 GiB optimizer state, "
            "763 MiB communication buffers; asked for 3.91 GiB more"
        )
        assert peak in words and oom in words
        assert words.index("OUT OF MEMORY") < words.index(peak) < words.index(oom) < words.index("Why")


async def test_a_run_using_little_of_its_gpu_is_magnified_and_says_so(tmp_path: Path) -> None:
    runs = copy_runs(tmp_path / "runs", FINISHED)
    app = app_for(tmp_path / "runs", str(runs[FINISHED]))
    async with app.run_test(size=(160, 48)) as pilot:
        screen = await opened(pilot, app)
        lines = screen.query_one(RankMemory).render().plain.splitlines()
        assert lines[1].rstrip().endswith(" zoom ×36"), "3.8 GiB held, 1.29 of them outside PyTorch, of 140 GiB"
        bar = bar_of(lines[1].rstrip().removesuffix(" zoom ×36"))
        assert runs_of(bar) == "█╳▒▚" + PEAK + "▚", "the parts fill the magnified bar to its end"
        at = bar.index(PEAK)
        assert at / len(bar) <= 3_175_195_648 * 36 / 150_754_820_096 < (at + 1) / len(bar), "2.96 GiB, ×36"
        assert lines[2].strip().startswith("█param 805M █grad 805M █optim 805M ▚outside 1.29G")
        assert lines[3].strip().endswith(" memory per step"), "under the bar: its memory at each step"
        assert lines[4].strip().endswith(f"{PEAK}peak 2.96G of 140G")


async def test_c_cycles_what_the_rank_columns_count(tmp_path: Path) -> None:
    runs = copy_runs(tmp_path / "runs", FINISHED, SETUP_OOM)
    app = app_for(tmp_path / "runs", str(runs[FINISHED]))
    async with app.run_test(size=(160, 48)) as pilot:
        screen = await opened(pilot, app)
        tree = screen.query_one(ShardTree)
        assert any(b.binding.key == "c" and b.binding.show for b in screen.active_bindings.values()), "in the footer"

        def header() -> str:
            return tree.render_line(0).text

        def cells(path: str) -> str:
            """The r0 cell of ``path``'s line."""
            model = tree.model
            assert model is not None
            index = next(i for i, line in enumerate(tree.lines) if line.node == model.row_of(path))
            return tree.render_line(index + 1).text.split()[-1]

        seen = []
        for _ in range(6):
            words = header().split("→")[0].split(maxsplit=1)[1].strip()
            seen.append((words, cells(""), cells("conv2")))
            await pilot.press("c")
        assert seen == [
            ("parameter bytes per rank", "805M", "24.0M"),
            ("gradient bytes per rank", "805M", "24.0M"),
            ("optimizer bytes per rank", "805M", "24.0M"),
            ("activation bytes per rank", "417M", "0"),
            ("on-device total bytes per rank", "2.77G", "72.0M"),
            ("parameter bytes per rank", "805M", "24.0M"),
        ], "conv2 saves nothing for backward: its activations are 0 (measured), not unknown"

    app = app_for(tmp_path / "runs", str(runs[SETUP_OOM]))
    async with app.run_test(size=(80, 24)) as pilot:
        screen = await opened(pilot, app)
        tree = screen.query_one(ShardTree)
        await pilot.press("c")
        assert "gradient bytes" in tree.render_line(0).text
        rows = [tree.render_line(y).text.split()[-1] for y in range(1, len(tree.lines) + 1)]
        assert rows == ["-"] * len(tree.lines), "an OOM at set-up: no gradient existed, none is 0"


def as_ranks(run: Path, n: int) -> None:
    """Rank 0's events written again as ranks 1…n-1 (own pids), and every rank told the world is ``n``."""
    events, _skipped = read_all(run / "events")
    for rank in range(n):
        lines = []
        for e in events:
            moved = msgspec.structs.replace(e, rank=rank)
            if isinstance(moved, Hello):
                moved = msgspec.structs.replace(moved, world_size=n, pid=moved.pid + rank)
            lines.append(encode(moved))
        event_file(run / "events", rank).write_bytes(b"".join(lines))


@pytest.mark.parametrize(
    ("ranks", "size", "lines_each", "legend"),
    [(2, (80, 24), 4, 1), (4, (80, 24), 2, 0), (2, (160, 48), 5, 1), (5, (160, 48), 4, 0)],
    ids=["2-ranks-tall", "4-ranks-two-line", "2-ranks-wide", "5-ranks-wide"],
)
async def test_stacked_bars_keep_the_layouts(
    tmp_path: Path, ranks: int, size: tuple[int, int], lines_each: int, legend: int
) -> None:
    """Tall and wide keep a line of legend per rank while it fits; two-line and many ranks keep the bar only."""
    runs = copy_runs(tmp_path / "runs", SETUP_OOM)
    as_ranks(runs[SETUP_OOM], ranks)
    app = app_for(tmp_path / "runs", str(runs[SETUP_OOM]))
    async with app.run_test(size=size) as pilot:
        screen = await opened(pilot, app)
        panel = screen.query_one(RankMemory)
        await wait_for(pilot, lambda: len(panel.rows) == ranks, what=f"{ranks} ranks")
        await settled(pilot)
        text: Text = panel.render()
        lines = text.plain.splitlines()
        assert len(lines) == ranks * lines_each
        for r in range(ranks):
            own = lines[r * lines_each : (r + 1) * lines_each]
            assert own[0].startswith(f"r{r} ")
            assert runs_of(bar_of(own[1])).startswith("█▒"), own[1]
            assert PEAK in own[1], own[1]
            assert sum("█param" in line for line in own) == legend
