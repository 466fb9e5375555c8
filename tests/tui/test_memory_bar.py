"""The stacked memory bar's arithmetic: cells per kind, the peak's cell, the zoom, the legend.

Pure functions (``shardtop.tui.memory_bar``), checked on the split the probe
recorded at a real set-up OOM on an H200 and on any split hypothesis makes up.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from shardtop.read.rank_facts import RankFacts
from shardtop.read.whole_run import read_run
from shardtop.rundir.memory_figures import MemoryKinds, MemorySplit
from shardtop.rundir.run_directory import RunDirectory
from shardtop.tui.memory_bar import (
    FREE,
    PEAK,
    SMALL,
    BarPart,
    LegendEntry,
    bar_parts,
    legend_entries,
    legend_lines,
    peak_cell,
    stacked_runs,
    zoom_of,
)
from tests.support.recorded import recorded_run

GIB = 1 << 30
MIB = 1 << 20


def setup_oom_rank() -> RankFacts:
    """zero3-linear-fixed on one H200, 15 GiB cap: OOM in ``_configure_zero_optimizer`` at set-up."""
    (rank,) = read_run(RunDirectory(recorded_run("h200-split/zero3-linear-fixed"))).ranks
    return rank


def drawn(runs: tuple[object, ...]) -> str:
    return "".join(f"{r.name}:{r.cells} " for r in runs).strip()  # type: ignore[attr-defined]


def test_the_setup_oom_stacks_its_kinds_in_proportion() -> None:
    """At the OOM: 3.91 GiB parameters, 3.91 GiB optimizer state, 763 MiB comm buffers, then 3.17 GiB
    of cache and 1.14 GiB outside PyTorch, against a 15 GiB limit in 40 cells (one cell: 384 MiB)."""
    rank = setup_oom_rank()
    parts = bar_parts(rank.memory_now, rank.cache_bytes, rank.outside_pytorch_bytes)
    assert [p.name for p in parts] == ["params", "optimizer", "comm", "cache", "outside"]
    assert rank.memory_now is not None and rank.memory_now.by_kind.grads == 1024, (
        "1 KiB of gradients beside 12.9 GiB is rounding: left out, as the sentences leave it out"
    )
    runs = stacked_runs(parts, 15 * GIB, 40)
    assert drawn(runs) == "params:10 optimizer:10 comm:2 cache:9 outside:3 free:6"
    assert peak_cell(rank.allocator_peak, 15 * GIB, 40) == 31, "11.7 GiB of 15 falls in the 32nd cell"


def test_without_a_split_there_is_nothing_to_stack() -> None:
    assert bar_parts(None, 3 * GIB, None) == ()
    cpu = MemorySplit(by_kind=MemoryKinds(params=4 * MIB, grads=0))
    assert bar_parts(cpu, None, None) == (BarPart("params", 4 * MIB),), "a kind of 0 bytes takes no cell"


def test_kinds_too_small_for_a_cell_are_merged_where_the_first_of_them_stacks() -> None:
    """fsdp-auto-wrap after its steps, against 15 GiB: 122 MiB unexplained and 97 MiB of cache are a
    third of a cell each; together they are one ▪ cell, after the optimizer state."""
    (rank,) = read_run(RunDirectory(recorded_run("h200-split/fsdp-auto-wrap"))).ranks
    parts = bar_parts(rank.memory_now, rank.cache_bytes, rank.outside_pytorch_bytes)
    runs = stacked_runs(parts, 15 * GIB, 40)
    assert drawn(runs) == "params:2 grads:2 optimizer:2 small:1 outside:3 free:30"
    assert runs[3].holds == ("unexplained", "cache")
    entries = legend_entries(parts, runs)
    assert [e.text for e in entries if e.name in runs[3].holds] == ["▪unexpl 122M", "▪cache 96.6M"], (
        "the legend draws them with the glyph the bar drew them with"
    )


def test_more_kinds_than_cells_keep_the_largest_and_merge_the_rest() -> None:
    parts = [BarPart(k, (10 - i) * MIB) for i, k in enumerate(("params", "grads", "optimizer", "activations", "comm"))]
    runs = stacked_runs(parts, sum(p.bytes for p in parts), 3)
    assert [r.name for r in runs] == ["params", "grads", SMALL]
    assert runs[2].holds == ("optimizer", "activations", "comm") and sum(r.cells for r in runs) == 3


def test_a_bar_over_its_scale_is_full_not_longer() -> None:
    runs = stacked_runs([BarPart("params", 14 * GIB), BarPart("outside", 3 * GIB)], 15 * GIB, 20)
    assert sum(r.cells for r in runs) == 20 and FREE not in [r.name for r in runs]


@settings(max_examples=300, deadline=None)
@given(
    sizes=st.lists(st.integers(min_value=1, max_value=200 * GIB), min_size=1, max_size=9),
    scale=st.integers(min_value=1, max_value=300 * GIB),
    width=st.integers(min_value=1, max_value=80),
)
def test_runs_fill_the_bar_and_lose_no_kind(sizes: list[int], scale: int, width: int) -> None:
    names = ["params", "grads", "optimizer", "activations", "comm", "other", "unexplained", "cache", "outside"]
    parts = [BarPart(names[i], b) for i, b in enumerate(sizes)]
    runs = stacked_runs(parts, scale, width)
    assert sum(r.cells for r in runs) == width and all(r.cells > 0 for r in runs)
    filled = sum(r.cells for r in runs if r.name != FREE)
    assert filled == min(width, max(1, round(sum(sizes) / scale * width)))
    shown = {n for r in runs for n in (r.holds or (r.name,))}
    assert shown >= {p.name for p in parts}, "every kind has cells of its own or is in the small run"
    assert [r.name for r in runs if r.name not in (SMALL, FREE)] == [
        p.name for p in parts if p.name in {r.name for r in runs}
    ], "in stacking order"
    cell = sum(sizes) / filled
    for r in runs:
        if r.name not in (SMALL, FREE):
            ideal = next(p.bytes for p in parts if p.name == r.name) / cell
            assert abs(r.cells - ideal) < len(parts) / 2 + 1, "a kind's cells follow its bytes"


def test_the_peak_mark_sits_in_the_cell_its_bytes_fall_in() -> None:
    assert peak_cell(50, 100, 10) == 5, "half way: the 6th cell (50…60 % of the scale)"
    assert peak_cell(59, 100, 10) == 5 and peak_cell(49, 100, 10) == 4
    assert peak_cell(100, 100, 10) == 9, "full: the last cell"
    assert peak_cell(130, 100, 10) == 9
    assert peak_cell(4, 100, 10) == 0
    assert peak_cell(None, 100, 10) is None and peak_cell(0, 100, 10) is None


def test_bars_are_magnified_only_when_every_rank_uses_under_a_quarter() -> None:
    """fsdp-auto-wrap on an H200: 2.96 GiB at its peak of a 140 GiB GPU."""
    h200 = 150_754_820_096
    assert zoom_of([(3_175_195_648, h200)]) == 47
    assert zoom_of([(3_175_195_648, h200), (30 * GIB, h200)]) == 4, "the fullest rank sets it"
    assert zoom_of([(3_175_195_648, h200), (60 * GIB, h200)]) == 1, "one factor for all ranks"
    assert zoom_of([(setup_oom_rank().allocator_peak or 0, 15 * GIB)]) == 1
    assert zoom_of([]) == 1


def test_the_legend_names_the_largest_kinds_in_bar_order_and_counts_the_rest() -> None:
    rank = setup_oom_rank()
    parts = bar_parts(rank.memory_now, rank.cache_bytes, rank.outside_pytorch_bytes)
    entries = legend_entries(parts, stacked_runs(parts, 15 * GIB, 40))
    wide = legend_lines(entries, 60, 1)
    assert [" ".join(e.text for e in line) for line in wide.lines] == [
        "█param 3.91G █optim 3.91G ▒cache 3.17G ▚outside 1.14G"
    ], "the four largest, in the bar's order"
    assert wide.more == " +1", "763 MiB of comm buffers did not fit"
    peak = LegendEntry("peak", PEAK, rank.allocator_peak or 0)
    narrow = legend_lines(entries, 26, 2, [peak])
    assert [" ".join(e.text for e in line) for line in narrow.lines] == [
        "█param 3.91G █optim 3.91G",
        "▒cache 3.17G │peak 11.7G",
    ]
    assert narrow.more == "…", "no room for +2: an ellipsis says some are left out"
    for width, legend in ((60, wide), (26, narrow), (12, legend_lines(entries, 12, 1, [peak]))):
        assert all(len(" ".join(e.text for e in line)) <= width for line in legend.lines)
        assert len(" ".join(e.text for e in legend.lines[-1])) + len(legend.more) <= width
    assert legend_lines(entries, 12, 1, [peak]).lines == ((peak,),), "the peak first"
