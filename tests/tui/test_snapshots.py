"""What the user sees, at 80×24 (SSH) and 160×48, replaying recorded runs.

Deterministic: recorded NVML and psutil answers, finished runs (their elapsed
time ends with them), one GPU sample (a refresh longer than the test), UTC,
and paths shown relative to the working directory.  Update after a deliberate
change with ``pytest tests/tui/test_snapshots.py --snapshot-update`` and look
at the report before committing.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from shardtop.gpus import GpuUnavailable, HostSample
from shardtop.tui.app import ShardtopApp
from shardtop.tui.screens.home import HomeScreen
from shardtop.tui.widgets.run_header import RunHeader
from shardtop.tui.widgets.shard_tree import ShardTree
from tests.tui.conftest import HOST, RecordedHost, copy_fixture_runs, h200_pair, h200_processes, wait_for
from tests.tui.recorded import recorded_diagnosis

SIZES = [pytest.param((80, 24), id="80x24"), pytest.param((160, 48), id="160x48")]
HOUR = 3600.0
"""A refresh longer than any test: the feeds poll once, so the picture cannot move."""


def frozen_clock() -> float:
    return 1795960000.0 + 600


def app(root: Path, run: str | None = None, gpus: bool = True) -> ShardtopApp:
    host = RecordedHost(HOST, h200_processes() if gpus else {})
    return ShardtopApp(
        root,
        run=run,
        refresh=HOUR,
        findings=recorded_diagnosis,
        gpu_source=h200_pair() if gpus else None,  # type: ignore[arg-type]
        host_probe=host,
        clock=frozen_clock,
    )  # type: ignore[arg-type]


def home_ready() -> Callable[[Any], Any]:
    async def run_before(pilot: Any) -> None:
        screen = pilot.app.screen
        await wait_for(
            pilot,
            lambda: isinstance(screen, HomeScreen) and screen.gpus is not None and screen.runs is not None,
            what="the home screen's first data",
        )

    return run_before


def run_ready(*keys: str) -> Callable[[Any], Any]:
    async def run_before(pilot: Any) -> None:
        await wait_for(
            pilot,
            lambda: (
                pilot.app.screen.query(ShardTree)
                and pilot.app.screen.query_one(ShardTree).model is not None
                and pilot.app.screen.query_one(RunHeader).info is not None
            ),
            what="the run view",
        )
        await pilot.press(*keys)
        await pilot.pause()

    return run_before


@pytest.fixture
def in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.mark.parametrize("size", SIZES)
def test_home_with_gpus(snap_compare: Any, recorded_root: Path, in_tmp: Path, size: tuple[int, int]) -> None:
    assert snap_compare(app(recorded_root), terminal_size=size, run_before=home_ready())


class NoDriver:
    """NVML's answer on a machine without the NVIDIA driver, recorded."""

    def sample(self) -> list[Any]:
        raise GpuUnavailable("no NVIDIA driver: NVML Shared Library Not Found")


@pytest.mark.parametrize("size", SIZES)
def test_home_without_a_driver(snap_compare: Any, recorded_root: Path, in_tmp: Path, size: tuple[int, int]) -> None:
    host = RecordedHost(HostSample(cpu_percent=3.0, cores=8, memory_used=6 * 2**30, memory_total=31 * 2**30))
    laptop = ShardtopApp(
        recorded_root,
        refresh=HOUR,
        gpu_source=NoDriver(),
        host_probe=host,  # type: ignore[arg-type]
        clock=frozen_clock,
    )
    assert snap_compare(laptop, terminal_size=size, run_before=home_ready())


@pytest.mark.parametrize("size", SIZES)
def test_run_view_at_the_oom(snap_compare: Any, recorded_root: Path, in_tmp: Path, size: tuple[int, int]) -> None:
    assert snap_compare(app(recorded_root, run="zero3-linear-0a0e"), terminal_size=size, run_before=run_ready())


@pytest.mark.parametrize("size", SIZES)
def test_run_view_of_a_real_fsdp2_run(snap_compare: Any, in_tmp: Path, size: tuple[int, int]) -> None:
    runs = copy_fixture_runs(in_tmp / "runs")
    assert snap_compare(
        app(in_tmp / "runs", run=str(runs[0])),
        terminal_size=size,
        run_before=run_ready("down", "down", "enter", "down", "m"),
    )


def test_run_view_search_and_open_fold(snap_compare: Any, recorded_root: Path, in_tmp: Path) -> None:
    assert snap_compare(
        app(recorded_root, run="zero3-linear-0a0e"),
        terminal_size=(80, 24),
        run_before=run_ready("slash", *"net.12", "enter", "n", "l"),
    )


def test_run_view_at_the_oom_without_colour(
    snap_compare: Any, recorded_root: Path, in_tmp: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """NO_COLOR: the OOM still reads as ✗ OOM, the bars as █ ▒ ░, the statuses as words."""
    monkeypatch.setenv("NO_COLOR", "1")
    assert snap_compare(app(recorded_root, run="zero3-linear-0a0e"), terminal_size=(80, 24), run_before=run_ready())
