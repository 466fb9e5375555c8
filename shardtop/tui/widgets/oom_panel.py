"""``OomPanel``: where and how a rank ran out of memory, every GPU at that moment, and why."""

from __future__ import annotations

import textwrap

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.containers import VerticalScroll
from textual.widgets import Static

from shardtop.diagnose import Finding
from shardtop.read.oom_story import OomStory
from shardtop.read.run_model import RunModel
from shardtop.rundir.memory_figures import GpuMemory, MemorySplit
from shardtop.tui.format import bar, format_bytes, fraction
from shardtop.tui.widgets.findings_list import finding_text
from shardtop.units import short_bytes
from shardtop.words import module_label

MESSAGE_CHARS = 300
"""The CUDA error's first line, cut at a word: the figures come first, the advice about the allocator after."""


def culprit_words(story: OomStory) -> Text:
    """The module the OOM names, or, without one, what is known about it: its type, zero.Init."""
    if story.module is not None:
        return Text.assemble(
            (module_label(story.module), "bold"), f" ({story.module_type})" if story.module_type else ""
        )
    words = Text("not known", style="italic")
    known = story.unnamed
    if known:
        words.append(f": {known}", style="")
    return words


def no_module_words(story: OomStory) -> str:
    """Why ``o`` cannot go to the OOM in the tree, and what is known instead."""
    o = story.oom
    where = f" in {o.engine_step}" if o.engine_step else f" during {o.phase}"
    known = story.unnamed
    return (
        f"The OOM names no module path: rank {o.rank} ran out of memory{where}"
        + (f", with {known}." if known else ".")
    )


def gpu_table(gpus: list[GpuMemory], width: int = 16) -> Table:
    table = Table.grid(padding=(0, 1))
    for g in gpus:
        filled, empty = bar(fraction(g.used, g.total), width)
        pids = f"pids {', '.join(map(str, g.pids))}" if g.pids else ""
        table.add_row(
            f"GPU{g.index}",
            Text.assemble((filled, "bold"), (empty, "dim")),
            f"{short_bytes(g.used)}/{short_bytes(g.total)}",
            pids,
        )
    return table


def memory_words(story: OomStory, peak: MemorySplit | None) -> Text | None:
    """What filled the rank's memory at its peak and at the OOM, one paragraph each (``OomStory.memory_rows``,
    as the report says it): ``at the peak (step 0, setup) 11.7 GiB allocated: …``; None where the probe
    split neither."""
    rows = story.memory_rows(peak)
    if not rows:
        return None
    return Text("\n").join(Text.assemble((label, "bold"), " ", words) for label, words in rows)


def trimmed(text: Text) -> Text:
    """``text`` without its closing newline: the section titles bring their own blank line."""
    text.rstrip()
    return text


def oom_report(
    story: OomStory, findings: tuple[Finding, ...], others: tuple[OomStory, ...], peak: MemorySplit | None = None,
    snapshot: str = "",
) -> RenderableType:
    """The OOM panel's content: what failed and what filled the memory (``peak``: the rank's split at
    its peak, ``RankFacts.memory_peak``), why (the findings that explain it), then the evidence
    (``snapshot``: the allocator's snapshot the rank wrote at its OOM, its path in the run directory)."""
    oom = story.oom
    head = Text()
    head.append("✗ OUT OF MEMORY", "bold reverse")
    head.append(f"  rank {oom.rank}", "bold")
    head.append(f" on {oom.host}" if oom.host else "")
    head.append(f", {oom.device}, {story.when}")
    facts = Table.grid(padding=(0, 1))
    facts.add_column(style="bold", no_wrap=True)
    facts.add_column(overflow="fold")
    facts.add_row("module", culprit_words(story))
    facts.add_row("found by", story.found_by)
    if oom.engine_step:
        facts.add_row("engine step", oom.engine_step)
    if oom.requested_bytes is not None:
        facts.add_row("requested", format_bytes(oom.requested_bytes))
    if oom.device == "cpu" and oom.limit and not oom.allocated:  # gpu_mem_limit on CPU caps the data segment
        facts.add_row("cap", f"+{format_bytes(oom.limit)} data segment (RLIMIT_DATA) from the rank's start")
    elif story.held:
        facts.add_row("rank held", ", ".join(f"{label} {format_bytes(v)}" for label, v in story.held))
    if story.stack:
        facts.add_row("stack", story.stack_words)
    if oom.gpus:
        facts.add_row("GPUs then", gpu_table(oom.gpus))
    if story.error_line:
        facts.add_row(
            "error", Text(textwrap.shorten(story.error_line, MESSAGE_CHARS, placeholder=" …"), style="italic")
        )
    if others:
        facts.add_row("also", ", ".join(s.short.removeprefix("OOM on ") for s in others))
    if snapshot:
        facts.add_row("snapshot", f"{snapshot}: python -m torch.cuda._memory_viz trace_plot FILE -o oom.html, "
                                  "or drag it into pytorch.org/memory_viz")
    # the explanation first: what to change is what the user came for; the evidence follows
    why = [f for f in findings if f.severity == "error"]
    other = [f for f in findings if f.severity != "error"]
    parts: list[RenderableType] = [head]
    memory = memory_words(story, peak)
    if memory is not None:
        parts.append(memory)
    if why:
        parts += [Text("\nWhy", style="bold underline"), *(trimmed(finding_text(f)) for f in why)]
    parts += [Text("\nWhat happened", style="bold underline"), facts]
    if other:
        parts += [Text("\nAlso found", style="bold underline"), *(trimmed(finding_text(f)) for f in other)]
    return Group(*parts)


class OomPanel(VerticalScroll):
    """Shown once a rank reports an OOM; the first OOM leads, the others are listed."""

    DEFAULT_CSS = """
    OomPanel > Static {
        height: auto;
    }
    """

    def __init__(self, id: str | None = None, classes: str | None = None) -> None:
        super().__init__(id=id, classes=classes)
        self.oom: OomStory | None = None
        self._shown: tuple[object, ...] | None = None

    def compose(self) -> ComposeResult:
        yield Static("No rank has run out of memory.", id="oom-text")

    def show(self, model: RunModel, findings: tuple[Finding, ...]) -> None:
        """The read model's OOMs (the first leads) and the first OOM's rank's split at its peak."""
        ooms = model.ooms
        facts = model.rank(ooms[0].rank) if ooms else None
        peak = facts.memory_peak if facts is not None else None
        snapshot = next((s.file for s in facts.state.snapshots if s.moment == "oom"), "") if facts is not None else ""
        key = (tuple(id(s.oom) for s in ooms), findings, id(peak), snapshot)
        if key == self._shown:
            return
        self._shown = key
        if not ooms:
            self.oom = None
            return
        self.oom = ooms[0]
        self.query_one("#oom-text", Static).update(oom_report(ooms[0], findings, ooms[1:], peak, snapshot))
