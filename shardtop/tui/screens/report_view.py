"""``ReportScreen``: the Markdown post-mortem of a run, and where it was saved."""

from __future__ import annotations

from pathlib import Path

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Static

from shardtop.rundir.run_directory import RunDirectory

REPORT_NAME = "report.md"


def render_markdown(run: RunDirectory) -> str:
    """``shardtop.report.render_report(run, "markdown")``; a clear error if it is not there."""
    try:
        from shardtop.report import render_report
    except ImportError as e:
        raise RuntimeError(f"the report module is not available in this shardtop ({e}).") from None
    return render_report(run, "markdown")


def save_report(run: RunDirectory, text: str) -> Path:
    path = run.path / REPORT_NAME
    tmp = path.with_name(f".{REPORT_NAME}.tmp")
    tmp.write_text(text)
    tmp.replace(path)
    return path


class ReportScreen(ModalScreen[None]):
    """Shows the report; ``saved`` is where it was written (None when read-only)."""

    BINDINGS = [Binding("escape,q,r", "close", "Close report")]

    def __init__(self, markdown: str, saved: Path | None) -> None:
        super().__init__()
        self.markdown = markdown
        self.saved = saved

    def compose(self) -> ComposeResult:
        from textual.widgets import Markdown  # markdown-it costs 40 ms at start-up; only a report needs it

        where = (
            f"saved to {self.saved}"
            if self.saved
            else "not saved (read-only); `shardtop report RUN --format markdown` prints it"
        )
        with VerticalScroll(id="dialog", classes="dialog report"):
            yield Static(where, classes="dialog--question")
            yield Markdown(self.markdown)

    def action_close(self) -> None:
        self.dismiss(None)
