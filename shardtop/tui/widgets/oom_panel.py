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
from shardtop.events import ATTRIBUTED_BY_WORDS, GpuMemory, Oom
from shardtop.tui.format import bar, format_bytes, fraction, short_bytes
from shardtop.tui.widgets.findings_list import finding_text

MESSAGE_CHARS = 300
"""The CUDA error's first line, cut at a word: the figures come first, the advice about the allocator after."""


def under_zero_init(oom: Oom) -> bool:
    """The rank ran out while deepspeed.zero.Init was partitioning a module as it was built."""
    return oom.attributed_by == "init-frame" or (oom.engine_step or "").startswith("Init.")


def unnamed_culprit(oom: Oom) -> str:
    """What is known of a module the OOM cannot name: ``a Linear being built under deepspeed.zero.Init``."""
    built = f"a {oom.module_type}" if oom.module_type else "a module"
    if under_zero_init(oom):
        return f"{built} being built under deepspeed.zero.Init"
    return built if oom.module_type else ""


def culprit_words(oom: Oom) -> Text:
    """The module the OOM names, or, without one, what is known about it: its type, zero.Init."""
    if oom.module is not None:
        return Text.assemble(
            (oom.module or "(the whole model)", "bold"), f" ({oom.module_type})" if oom.module_type else ""
        )
    words = Text("not known", style="italic")
    known = unnamed_culprit(oom)
    if known:
        words.append(f": {known}", style="")
    return words


def no_module_words(oom: Oom) -> str:
    """Why ``o`` cannot go to the OOM in the tree, and what is known instead."""
    where = f" in {oom.engine_step}" if oom.engine_step else f" during {oom.phase}"
    known = unnamed_culprit(oom)
    return f"The OOM names no module path: rank {oom.rank} ran out of memory{where}" + (
        f", with {known}." if known else "."
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


def trimmed(text: Text) -> Text:
    """``text`` without its closing newline: the section titles bring their own blank line."""
    text.rstrip()
    return text


def oom_report(oom: Oom, findings: tuple[Finding, ...], others: list[Oom]) -> RenderableType:
    """The OOM panel's content: what failed, why (the findings that explain it), then the evidence."""
    head = Text()
    head.append("✗ OUT OF MEMORY", "bold reverse")
    head.append(f"  rank {oom.rank}", "bold")
    head.append(f" on {oom.host}" if oom.host else "")
    head.append(f", {oom.device}, during {oom.phase}" + (f" (step {oom.step})" if oom.step else ""))
    facts = Table.grid(padding=(0, 1))
    facts.add_column(style="bold", no_wrap=True)
    facts.add_column(overflow="fold")
    facts.add_row("module", culprit_words(oom))
    facts.add_row("found by", ATTRIBUTED_BY_WORDS.get(oom.attributed_by, oom.attributed_by))
    if oom.engine_step:
        facts.add_row("engine step", oom.engine_step)
    if oom.requested_bytes is not None:
        facts.add_row("requested", format_bytes(oom.requested_bytes))
    held = [
        f"allocated {format_bytes(oom.allocated)}" if oom.allocated is not None else "",
        f"reserved {format_bytes(oom.reserved)}" if oom.reserved is not None else "",
        f"limit {format_bytes(oom.limit)}" if oom.limit else "",
        f"device total {format_bytes(oom.total)}" if oom.total else "",
    ]
    if any(held):
        facts.add_row("rank held", ", ".join(h for h in held if h))
    if oom.module_stack:
        stack = " → ".join(p or "model" for p in oom.module_stack[-4:])
        facts.add_row("stack", ("… → " if len(oom.module_stack) > 4 else "") + stack)
    if oom.gpus:
        facts.add_row("GPUs then", gpu_table(oom.gpus))
    if oom.message:
        first_line = oom.message.strip().splitlines()[0]
        facts.add_row("error", Text(textwrap.shorten(first_line, MESSAGE_CHARS, placeholder=" …"), style="italic"))
    if others:
        facts.add_row("also", ", ".join(f"rank {o.rank} in {o.module or o.phase}" for o in others))
    # the explanation first: what to change is what the user came for; the evidence follows
    why = [f for f in findings if f.severity == "error"]
    other = [f for f in findings if f.severity != "error"]
    parts: list[RenderableType] = [head]
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
        self.oom: Oom | None = None
        self._shown: tuple[object, ...] | None = None

    def compose(self) -> ComposeResult:
        yield Static("No rank has run out of memory.", id="oom-text")

    def show(self, ooms: list[Oom], findings: tuple[Finding, ...]) -> None:
        key = (tuple(id(o) for o in ooms), findings)
        if key == self._shown:
            return
        self._shown = key
        if not ooms:
            self.oom = None
            return
        first = min(ooms, key=lambda o: o.t)
        self.oom = first
        self.query_one("#oom-text", Static).update(oom_report(first, findings, [o for o in ooms if o is not first]))
