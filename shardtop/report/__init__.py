"""``shardtop report``: a run's post-mortem as text, Markdown (for an issue) or JSON.

``render_report(run, fmt)`` reads the run's events (``event_files.read_all``),
folds them (``run_fold.fold``), asks ``diagnose`` for findings, and prints
the run, the OOM, the findings, per-rank totals and the folded shard tree.
No torch, no textual: the folding is ``shardtop.read.shard_model``'s, which is
pure Python.

- ``gather.py``: everything the report says, read once
- ``tree_summary.py``: which tree lines a report shows
- ``blocks.py`` + ``document.py``: the text and Markdown layouts
- ``json_report.py``: the JSON (schema in ``docs/report-json.md``)
- ``perfetto.py``: the timeline as a trace for Perfetto (``docs/perfetto.md``)
"""

from __future__ import annotations

from typing import Literal

from shardtop.report.blocks import report_blocks
from shardtop.report.document import to_markdown, to_text
from shardtop.report.gather import ReportData, gather
from shardtop.report.json_report import REPORT_SCHEMA_VERSION, report_dict, to_json
from shardtop.report.perfetto import render_trace
from shardtop.rundir.run_directory import RunDirectory

ReportFormat = Literal["text", "markdown", "json", "perfetto"]
"""What ``shardtop report --format`` writes: text for a terminal, Markdown for an issue, JSON for scripts,
a Perfetto trace of the timeline."""

FORMATS: tuple[ReportFormat, ...] = ("text", "markdown", "json", "perfetto")


def render_report(run: RunDirectory, fmt: ReportFormat = "text") -> str:
    """The report of ``run`` in ``fmt``: ``text``, ``markdown``, ``json`` or ``perfetto`` (a trace)."""
    if fmt not in FORMATS:
        raise ValueError(f"unknown report format {fmt!r}; expected one of {', '.join(FORMATS)}")
    if fmt == "perfetto":
        return render_trace(run)
    data = gather(run)
    if fmt == "json":
        return to_json(data)
    blocks = report_blocks(data)
    return to_markdown(blocks) if fmt == "markdown" else to_text(blocks)


__all__ = ["FORMATS", "REPORT_SCHEMA_VERSION", "ReportData", "ReportFormat", "gather", "render_report", "report_dict"]
