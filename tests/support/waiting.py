"""Waiting: on a Pilot-driven app, for a condition and for the screen to settle before a picture; on a
process, for a condition."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

from rich.cells import cell_len
from rich.text import Text
from textual.widgets import DataTable

QUIET_S = 0.1
"""How far apart two pictures of the screen must agree for it to count as settled."""


async def wait_for(pilot: object, condition: Callable[[], object], timeout: float = 10.0, what: str = "") -> None:
    """Let the app run until ``condition()`` is true; fail with ``what`` after ``timeout``."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what or condition}")
        await pilot.pause()  # type: ignore[attr-defined]


def wait_until(condition: Callable[[], object], timeout: float, what: str) -> None:
    """Poll ``condition()`` (outside any app) until it is true; fail with ``what`` after ``timeout``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def measured(table: DataTable[Any]) -> bool:
    """Whether a ``DataTable`` has laid out the rows it holds and sized its columns to them.

    A table places new rows and widens its columns when it next goes idle; until then a
    picture can show missing rows, or columns at their headers' widths.
    """
    rows = sum(row.height for row in table.rows.values())
    if table.virtual_size.height != rows + (table.header_height if table.show_header else 0):
        return False
    for key, column in table.columns.items():
        cells = [c.plain if isinstance(c, Text) else str(c) for c in table.get_column(key)]
        if column.content_width < max((cell_len(c) for c in cells), default=0):
            return False
    return True


async def after_refresh(app: Any, timeout: float) -> None:
    """Until the callbacks the app's widgets asked to run after the next refresh have run.

    A widget that scrolls to a row it has just drawn (the shard tree centring the OOM) does so after
    the refresh; two pictures can agree while that is still to come, on a screen kept busy.
    """
    done = asyncio.Event()
    app.screen.call_after_refresh(done.set)
    await asyncio.wait_for(done.wait(), max(0.1, timeout))


async def settled(pilot: object, timeout: float = 30.0) -> None:
    """Let the app run until its tables are laid out and the screen is the same ``QUIET_S`` apart.

    The data being there is not enough for a snapshot: a ``DataTable`` lays out its rows when its
    message queue next runs dry, which on a loaded machine can come after the test would have taken
    the picture, and the feeds' threads compete with the app's loop for the interpreter.  Before each
    picture, ``pilot.pause()`` lets every queued message be handled and waits for the process (its
    threads too) to use no CPU for a moment; between two pictures the app runs on for ``QUIET_S``.
    Each picture costs tens of milliseconds of CPU, so two that agree are enough.  The deadline only
    bounds a screen that never settles: on two cores with the engines' runs beside it, a resize to
    160x48 once took more than 10 s to be laid out and pictured twice alike.
    """
    app = pilot.app  # type: ignore[attr-defined]
    deadline = time.monotonic() + timeout
    before = None
    while time.monotonic() < deadline:
        await pilot.pause()  # type: ignore[attr-defined]
        await after_refresh(app, deadline - time.monotonic())
        if not all(measured(table) for table in app.screen.query(DataTable)):
            before = None
            continue
        now = app.export_screenshot()
        if now == before:
            return
        before = now
        await pilot.pause(QUIET_S)  # type: ignore[attr-defined]
    raise AssertionError(f"the screen did not settle in {timeout}s")
