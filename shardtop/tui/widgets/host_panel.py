"""``HostPanel``: the host's CPU and memory, and (without GPUs) the ranks' own memory."""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.reactive import reactive
from textual.widget import Widget

from shardtop.gpus import HostSample
from shardtop.read.run_state import RankState
from shardtop.tui.format import bar, format_bytes, fraction, short_run_id, sparkline
from shardtop.tui.repaint import PaintsChanges, PiecedLine
from shardtop.units import short_bytes


def rank_memory_words(run_id: str, rs: RankState) -> str:
    """``fsdp2-mlp-3fa1 r0 pid 4309 cpu: rss 1.21 GiB`` — what a rank says it holds."""
    m = rs.memory
    head = f"{short_run_id(run_id)} r{rs.rank}" + (f" pid {rs.pid}" if rs.pid else "") + f" {rs.device or '?'}"
    if m is None:
        return f"{head}: no memory sample yet"
    if m.allocated is not None:
        limit = f" of {format_bytes(m.limit)} limit" if m.limit else ""
        return f"{head}: allocated {format_bytes(m.allocated)}, reserved {format_bytes(m.reserved)}{limit}"
    return f"{head}: rss {format_bytes(m.host_rss)}"


class HostLine(PiecedLine):
    """The machine's line: the CPU figure, the words around it, the RAM bar and figure, each piece
    repainted on its own (a new CPU figure resends its four cells, not the words before it)."""

    PIECES = 5

    def pieces(self) -> list[Text]:
        panel = self.parent
        host = panel.host if isinstance(panel, HostPanel) else None
        if host is None or not isinstance(panel, HostPanel):
            return [Text() for _ in range(self.PIECES)]
        width = self.size.width or 80
        frac = fraction(host.memory_used, host.memory_total)
        filled, empty = bar(frac, max(8, min(30, width - 50)))
        return [
            Text.assemble(("host ", panel.get_component_rich_style("host-panel--label")), "CPU "),
            Text(f"{host.cpu_percent:3.0f}%"),
            Text(f" of {host.cores} cores  RAM "),
            Text.assemble(
                (filled, panel.get_component_rich_style("host-panel--used")),
                (empty, panel.get_component_rich_style("host-panel--free")),
            ),
            Text(f" {short_bytes(host.memory_used)}/{short_bytes(host.memory_total)}"),
        ]


MAX_RANK_LINES = 8
"""Lines the live ranks get at most; a run of 512 ranks is read in its own view."""


class RankLines(PaintsChanges):
    """One line per live rank (at most ``MAX_RANK_LINES``), where there are no GPUs to show them on."""

    DEFAULT_CSS = """
    RankLines {
        height: auto;
        text-wrap: nowrap;
        text-overflow: ellipsis;
    }
    """

    def draw(self) -> Text:
        panel = self.parent
        text = Text(no_wrap=True, overflow="ellipsis")
        if not isinstance(panel, HostPanel):
            return text
        if not panel.ranks:
            text.append("no live run: the ranks' own memory shows here while one runs")
        shown = panel.ranks if len(panel.ranks) <= MAX_RANK_LINES else panel.ranks[: MAX_RANK_LINES - 1]
        for i, (run_id, rs) in enumerate(shown):
            if i:
                text.append("\n")
            text.append(rank_memory_words(run_id, rs))
            if rs.allocated_history:
                text.append("  ")
                text.append(sparkline(rs.allocated_history, 12), panel.get_component_rich_style("host-panel--history"))
        if len(shown) < len(panel.ranks):
            more = len(panel.ranks) - len(shown)
            text.append(f"\n… {more} more ranks of live runs: open a run to see each rank's memory")
        return text


class HostPanel(Widget):
    """One line for the machine; one more per live rank where NVML cannot show them.

    A new sample repaints only the cells it changed (the CPU figure, say); a rank
    that comes or goes changes the panel's height.
    """

    COMPONENT_CLASSES = {"host-panel--label", "host-panel--used", "host-panel--free", "host-panel--history"}

    DEFAULT_CSS = """
    HostPanel {
        height: auto;
    }
    HostPanel > RankLines {
        display: none;
    }
    HostPanel.-ranks > RankLines {
        display: block;
    }
    """

    host: reactive[HostSample | None] = reactive(None, repaint=False)
    """The latest host sample."""
    ranks: reactive[tuple[tuple[str, RankState], ...]] = reactive((), repaint=False)
    """(run id, rank) of live runs; shown only when ``show_ranks``."""
    show_ranks: reactive[bool] = reactive(False, repaint=False)
    """True where there are no GPUs to show the ranks on."""

    def compose(self) -> ComposeResult:
        yield HostLine()
        yield RankLines()

    def show(
        self,
        host: HostSample | None = None,
        show_ranks: bool | None = None,
        ranks: tuple[tuple[str, RankState], ...] | None = None,
    ) -> None:
        """Take what changed (None: keep it); the terminal gets only the cells that differ."""
        if host is not None and host != self.host:
            self.host = host
            self.query_one(HostLine).lay_out()
        if show_ranks is not None:
            self.show_ranks = show_ranks
            self.set_class(show_ranks, "-ranks")
        if ranks is not None and ranks != self.ranks:
            self.ranks = ranks
            self.query_one(RankLines).repaint_changes()
