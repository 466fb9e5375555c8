"""The app as the TUI tests build it: on recorded hardware, optionally with a frozen clock, and the waits
a picture of the home or the run view needs."""

from __future__ import annotations

import io
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rich.console import Console
from textual.widgets import Static

from shardtop.tui.app import ShardtopApp
from shardtop.tui.screens.home import HomeScreen
from shardtop.tui.widgets.run_header import RunHeader
from shardtop.tui.widgets.shard_tree import ShardTree
from tests.support.recorded import H200_HOST, RecordedHost, recorded_h200
from tests.support.waiting import settled, wait_for

HOUR = 3600.0
"""A refresh longer than any test: the feeds poll once, so the picture cannot move."""


def frozen_clock() -> float:
    return 1795966800.0


def app_for(root: Path, run: str | None = None, read_only: bool = False) -> ShardtopApp:
    """The app on the recorded H200, opened on ``run`` if given."""
    return ShardtopApp(
        root,
        run=run,
        read_only=read_only,
        gpu_source=recorded_h200(),  # type: ignore[arg-type]
        host_probe=RecordedHost(H200_HOST),  # type: ignore[arg-type]
    )


def run_app(root: Path, run: Path) -> ShardtopApp:
    """The app opened on ``run``, for a picture: the recorded H200, one poll, the clock frozen."""
    return ShardtopApp(
        root,
        run=str(run),
        refresh=HOUR,
        gpu_source=recorded_h200(),  # type: ignore[arg-type]
        host_probe=RecordedHost(H200_HOST),  # type: ignore[arg-type]
        clock=frozen_clock,
    )


def text_of(widget: Static) -> str:
    """What a Static shows, as plain text (its content may be any Rich renderable)."""
    console = Console(width=200, file=io.StringIO(), record=True, color_system=None)
    console.print(widget.content)
    return console.export_text()


def home_ready() -> Callable[[Any], Any]:
    """A snapshot's ``run_before``: the home screen with its GPUs and runs, settled."""

    async def run_before(pilot: Any) -> None:
        screen = pilot.app.screen
        await wait_for(
            pilot,
            lambda: isinstance(screen, HomeScreen) and screen.gpus is not None and screen.runs is not None,
            what="the home screen's first data",
        )
        await settled(pilot)

    return run_before


def run_ready(*keys: str) -> Callable[[Any], Any]:
    """A snapshot's ``run_before``: the run view with its tree and header, settled, then ``keys``."""

    async def run_before(pilot: Any) -> None:
        await wait_for(
            pilot,
            lambda: (
                pilot.app.screen.query(ShardTree)
                and pilot.app.screen.query_one(RunHeader).info is not None
                and pilot.app.screen.snapshot is not None
            ),
            what="the run view",
        )
        await settled(pilot)
        if keys:
            await pilot.press(*keys)
            await settled(pilot)

    return run_before
