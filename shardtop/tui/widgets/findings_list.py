"""``FindingsList``: the diagnosis in plain words, most severe first."""

from __future__ import annotations

from collections.abc import Iterable

from rich.text import Text
from textual.containers import VerticalScroll
from textual.widgets import Static

from shardtop.diagnose import Finding
from shardtop.tui.format import format_bytes

SEVERITY_MARKS = {"error": "✗ error", "warning": "! warning", "info": "i info"}
"""Words beside the colour, so severity reads without it."""


def with_code_spans(markdown: str) -> Text:
    """Findings are written for Markdown: here a `code span` loses its backticks and is set in bold."""
    text = Text()
    for i, part in enumerate(markdown.split("`")):
        text.append(part, "bold" if i % 2 else "")
    return text


def finding_text(finding: Finding) -> Text:
    """One finding: severity, title, what happened, what to change, the saving."""
    style = {"error": "bold", "warning": "bold", "info": ""}.get(finding.severity, "")
    text = Text()
    text.append(f"{SEVERITY_MARKS.get(finding.severity, finding.severity)}  ", style)
    text.append(finding.title, "bold")
    text.append(f"  [{finding.code}]\n", "dim")
    if finding.detail:
        text.append_text(with_code_spans(finding.detail.strip() + "\n"))
    if finding.fix:
        text.append("fix: ", "bold")
        text.append_text(with_code_spans(finding.fix.strip() + "\n"))
    if finding.saving_bytes:
        text.append(f"saves ≈ {format_bytes(finding.saving_bytes)} per rank\n", "italic")
    named = [m for m in finding.modules if m]  # the root ("") is the whole model, which the finding says in words
    if named:
        shown = ", ".join(named[:5]) + (f" (+{len(named) - 5} more)" if len(named) > 5 else "")
        text.append(f"modules: {shown}\n", "dim")
    return text


def findings_text(findings: Iterable[Finding], empty: str = "No findings.") -> Text:
    parts = [finding_text(f) for f in findings]
    return Text("\n").join(parts) if parts else Text(empty, style="dim")


def concerning(findings: Iterable[Finding], path: str) -> list[Finding]:
    """Findings about ``path`` itself, a module above it, or a module inside it."""

    def related(module: str) -> bool:
        if not path or not module:
            return True
        return module == path or path.startswith(module + ".") or module.startswith(path + ".")

    return [f for f in findings if any(related(m) for m in f.modules)]


class FindingsList(VerticalScroll):
    """Every finding of the run."""

    DEFAULT_CSS = """
    FindingsList > Static {
        height: auto;
    }
    """

    def __init__(self, id: str | None = None, classes: str | None = None) -> None:
        super().__init__(id=id, classes=classes)
        self._shown: tuple[tuple[Finding, ...], str] | None = None

    def compose(self):  # type: ignore[no-untyped-def]
        yield Static(findings_text(()), id="findings-text")

    def show(self, findings: tuple[Finding, ...], caveat: str = "") -> None:
        """``caveat``: what the run cannot show (a rehearsal's), said above the findings."""
        if (findings, caveat) == self._shown:
            return
        self._shown = (findings, caveat)
        text = findings_text(findings, "No findings: nothing in this run's shards or memory looks wrong (yet).")
        if caveat:
            text = Text.assemble(("⚠ ", "bold"), (caveat, "italic"), "\n\n", text)
        self.query_one("#findings-text", Static).update(text)
