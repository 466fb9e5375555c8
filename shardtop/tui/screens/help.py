"""``HelpScreen``: the keys of the screen below it, and what the symbols mean."""

from __future__ import annotations

from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import ModalScreen, Screen
from textual.widgets import Static

from shardtop.tui.format import BAR_EIGHTHS, BAR_EMPTY, BAR_FULL, BAR_RESERVED, SPARKS
from shardtop.tui.memory_bar import CACHE, GLYPHS, OUTSIDE, PEAK, SMALL
from shardtop.tui.widgets.plan_bars import FREE as PLAN_FREE
from shardtop.tui.widgets.plan_bars import LIMIT as PLAN_LIMIT
from shardtop.tui.widgets.plan_bars import PART_MARKS

SYMBOLS = (
    ("▶ / ▼", "a closed / open module (Enter, Space, → and ← open and close)"),
    ("net.0 … net.17 18 × Linear", "repeated siblings of one type and size, folded into one line"),
    ("✗ OOM", "the module that was running when a rank ran out of memory"),
    ("✗", "a module on the way to the one that ran out of memory"),
    ("◆", "the root of a sharding unit (FSDP unit, ZeRO partition…)"),
    (
        f"{BAR_FULL} {' '.join(BAR_EIGHTHS[::-1])} {BAR_EMPTY}",
        "memory in use, its last cell filled to the eighth, and free: a GPU's memory, a CPU rank's resident "
        "memory (rss) of its host's",
    ),
    (f"{BAR_FULL} {BAR_RESERVED} {BAR_EMPTY}", "allocated, reserved but free (the allocator's cache), and free memory"),
    (
        " ".join((BAR_FULL, GLYPHS["unexplained"], GLYPHS[CACHE], GLYPHS[OUTSIDE], GLYPHS[SMALL], PEAK)),
        "a rank's memory by kind, each kind in its colour (the legend names them): measured, unexplained, "
        "the allocator's cache, outside PyTorch, kinds too small for a cell; the rank's peak",
    ),
    ("zoom ×47", "the memory bars magnified 47 times: every rank uses under a quarter of its GPU"),
    (SPARKS, "memory over time, lowest to highest: a GPU's latest samples, a rank's memory at each step"),
    (
        " ".join((*PART_MARKS, PLAN_FREE, PLAN_LIMIT)),
        "in the launch prompt's plan: parameters, gradients, optimizer state, the rest of the peak; free "
        "memory, and the limit where the peak goes past it",
    ),
    ("● ‖ ✓ ✗ ■ ?", "running, stalled, finished, failed, stopped, lost"),
    ("↗ grows", "a rank whose memory grows every step, and when it runs out"),
    ("✗ error  ! warning  i info", "how serious a finding is"),
)


GENERIC_ACTIONS = frozenset(
    {"page_left", "page_right", "scroll_left", "scroll_right", "copy_text", "focus_next", "focus_previous"}
)
"""Textual's own bindings that say nothing about shardtop."""


def keys_table(screen: Screen[object]) -> Table:
    """Every key of the screen once, in the words of its tooltip where it has one (the footer's short
    words in full: ``Quit shardtop; the runs go on``)."""
    table = Table.grid(padding=(0, 2))
    table.add_column(style="bold", no_wrap=True)
    table.add_column()
    seen: set[str] = set()
    for active in screen.active_bindings.values():
        binding = active.binding
        words = binding.tooltip or binding.description
        if not binding.description or words in seen or not active.enabled or binding.action in GENERIC_ACTIONS:
            continue
        seen.add(words)
        table.add_row(screen.app.get_key_display(binding), words)
    return table


class HelpScreen(ModalScreen[None]):
    """Opened with ``?``; any of Escape, q or ? closes it."""

    BINDINGS = [Binding("escape,q,question_mark", "dismiss", "Close help")]

    def __init__(self, below: Screen[object]) -> None:
        super().__init__()
        self.below = below

    def compose(self) -> ComposeResult:
        symbols = Table.grid(padding=(0, 2))
        symbols.add_column(style="bold", no_wrap=True)
        symbols.add_column()
        for mark, words in SYMBOLS:
            symbols.add_row(mark, words)
        with VerticalScroll(id="dialog", classes="dialog help"):
            yield Static(Text("shardtop — keys", style="bold"))
            yield Static(keys_table(self.below))
            yield Static(
                Text(
                    "\ntab moves between panels; ctrl+p opens the command palette; the mouse works too.", style="italic"
                )
            )
            yield Static(Text("\nSymbols", style="bold"))
            yield Static(symbols)
