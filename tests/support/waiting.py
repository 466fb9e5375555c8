"""Waiting on a Pilot-driven app: for a condition, and for the screen to settle before a picture."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from rich.cells import cell_len
from rich.text import Text
from textual.widgets import DataTable


async def wait_for(pilot: object, condition: Callable[[], object], timeout: float = 10.0, what: str = "") -> None:
    """Let the app run until ``condition()`` is true; fail with ``what`` after ``timeout``."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what or condition}")
        await pilot.pause(0.05)  # type: ignore[attr-defined]


def measured(table: DataTable[Any]) -> bool:
    """Whether a ``DataTable`` has measured its columns for the rows it holds.

    New rows are measured when the table next goes idle (``_require_update_dimensions``, Textual's
    own flag); until then a picture can show the columns at their headers' widths.
    """
    if getattr(table, "_require_update_dimensions", False) or getattr(table, "_new_rows", None):
        return False
    for key, column in table.columns.items():
        cells = [c.plain if isinstance(c, Text) else str(c) for c in table.get_column(key)]
        if column.content_width < max((cell_len(c) for c in cells), default=0):
            return False
    return True


async def settled(pilot: object, timeout: float = 10.0) -> None:
    """Let the app run until its tables are measured and two looks at the screen, a pause apart, agree.

    The data being there is not enough for a snapshot: a ``DataTable`` measures its
    columns when its message queue next runs dry, which on a loaded machine can come
    after the test would have taken the picture.
    """
    app = pilot.app  # type: ignore[attr-defined]
    deadline = time.monotonic() + timeout
    before = None
    while time.monotonic() < deadline:
        await pilot.pause(0.05)  # type: ignore[attr-defined]
        if not all(measured(table) for table in app.screen.query(DataTable)):
            continue
        now = app.export_screenshot()
        if now == before:
            return
        before = now
    raise AssertionError(f"the screen did not settle in {timeout}s")
