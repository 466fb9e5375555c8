"""``LogPane``: the ranks' and the supervisor's output, tailed."""

from __future__ import annotations

from collections.abc import Sequence

from textual.widgets import Log

MAX_LINES = 5000


class LogPane(Log):
    """Appends the new lines of each run snapshot; keeps the last ``MAX_LINES``."""

    DEFAULT_CSS = """
    LogPane {
        height: 1fr;
    }
    """

    def __init__(self, id: str | None = None, classes: str | None = None) -> None:
        super().__init__(max_lines=MAX_LINES, auto_scroll=True, id=id, classes=classes)

    def append(self, lines: Sequence[str]) -> None:
        if lines:
            self.write_lines(lines)
