"""Pure formatting: sizes in six cells, bars, sparklines, durations."""

from __future__ import annotations

from pathlib import Path

import pytest

from shardtop.tui.format import (
    BAR_EMPTY,
    BAR_FULL,
    bar,
    column_widths,
    duration,
    fraction,
    short_count,
    short_path,
    short_run_id,
    sparkline,
    split_bar,
    truncate,
)
from shardtop.units import short_bytes


@pytest.mark.parametrize(
    ("n", "text"),
    [
        (None, "-"),
        (0, "0"),
        (17, "17B"),
        (3 * 1024, "3.00K"),
        (512 * 2**20, "512M"),
        (int(1.96 * 2**30), "1.96G"),
        (int(139.8 * 2**30), "140G"),
        (2**41, "2.00T"),
    ],
)
def test_short_bytes_fit_six_cells(n: int | None, text: str) -> None:
    assert short_bytes(n) == text
    assert len(text) <= 6


def test_short_count() -> None:
    assert [short_count(n) for n in (12, 262_656, 4_720_000, 1_300_000_000)] == ["12", "263K", "4.72M", "1.30B"]


def test_bar_has_exact_width_and_eighths() -> None:
    for frac in (0.0, 0.01, 0.5, 0.999, 1.0, 1.7):
        filled, empty = bar(frac, 10)
        assert len(filled) + len(empty) == 10
    assert bar(1.0, 4) == (BAR_FULL * 4, "")
    assert bar(0.0, 4) == ("", BAR_EMPTY * 4)
    assert bar(0.5, 4)[0] == BAR_FULL * 2
    assert bar(0.55, 4)[0] == BAR_FULL * 2 + "▎"


def test_split_bar_keeps_a_cell_for_any_allocation() -> None:
    a, r, f = split_bar(0.001, 0.5, 10)
    assert (len(a), len(r), len(f)) == (1, 4, 5)
    a, r, f = split_bar(0.3, 0.1, 10)  # reserved below allocated: never negative
    assert (len(a), len(r), len(f)) == (3, 0, 7)


def test_sparkline_scales_and_right_aligns() -> None:
    assert sparkline([], 3) == "   "
    assert sparkline([0, 5, 10], 3) == "▁▄█"
    assert sparkline([10], 3, maximum=10) == "  █"
    assert sparkline(range(100), 5) == sparkline(range(95, 100), 5)


def test_fraction_and_duration() -> None:
    assert fraction(None, 10) == 0.0 and fraction(5, 0) == 0.0 and fraction(20, 10) == 1.0
    assert [duration(s) for s in (None, 12, 187, 3720, 2 * 86400 + 3 * 3600)] == ["-", "12s", "3m07s", "1h02m", "2d03h"]


def test_truncate_and_ids(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert truncate("transformer_1", 8) == "transfo…"
    assert truncate("abc", 8) == "abc"
    assert short_run_id("20261129-142233-zero3-linear-3fa1") == "zero3-linear-3fa1"
    assert short_run_id("my-run") == "my-run"
    monkeypatch.chdir(tmp_path)
    assert short_path(tmp_path / "runs" / "x") == "runs/x"


def test_columns_are_as_wide_as_their_widest_cell_header_included() -> None:
    rows = [("PID", "USER", "CPU %"), ("4194401", "trainer", "99"), ("7", "alice (other user)", "-")]
    assert column_widths(rows) == (
        7,
        18,
        5,
    )
