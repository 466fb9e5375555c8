"""``RankMemory``: each rank's memory — allocator allocated/reserved/peak vs its limit, and NVML."""

from __future__ import annotations

from dataclasses import dataclass

from rich.text import Text
from textual.reactive import reactive
from textual.widget import Widget

from shardtop.events import GpuMemory
from shardtop.run_state import RankState, RunState
from shardtop.tui.format import bar, fraction, short_bytes, sparkline, split_bar


@dataclass(frozen=True)
class RankMemoryRow:
    """What one rank's bar shows."""

    rank: int
    device: str
    pid: int | None
    allocated: int | None
    reserved: int | None
    peak: int | None
    limit: int | None
    host_rss: int
    gpu: GpuMemory | None
    """The NVML view of the rank's GPU (matched by pid, else by device index)."""
    history: tuple[int, ...]
    oom: bool
    exit: str


def device_index(device: str) -> int | None:
    """``cuda:1`` -> 1; None for cpu or an unknown form."""
    head, _, idx = device.partition(":")
    return int(idx) if head == "cuda" and idx.isdigit() else None


def gpu_of(rs: RankState, gpus: tuple[GpuMemory, ...]) -> GpuMemory | None:
    if rs.pid is not None:
        for g in gpus:
            if rs.pid in g.pids:
                return g
    index = device_index(rs.device)
    return next((g for g in gpus if g.index == index), None)


def rank_rows(state: RunState) -> tuple[RankMemoryRow, ...]:
    rows = []
    for rs in sorted(state.ranks.values(), key=lambda r: r.rank):
        m = rs.memory
        gpus = state.gpus.get(rs.host, ())
        rows.append(
            RankMemoryRow(
                rank=rs.rank,
                device=rs.device or "?",
                pid=rs.pid,
                allocated=m.allocated if m else None,
                reserved=m.reserved if m else None,
                peak=m.peak if m else None,
                limit=(m.limit if m else None) or (rs.oom.limit if rs.oom else None),
                host_rss=m.host_rss if m else 0,
                gpu=gpu_of(rs, gpus),
                history=rs.allocated_history,
                oom=rs.oom is not None,
                exit=rs.exit.status if rs.exit else "",
            )
        )
    return tuple(rows)


class RankMemory(Widget):
    """Per-rank memory bars; one line per rank when narrow, three when wide."""

    COMPONENT_CLASSES = {
        "rank-memory--label",
        "rank-memory--allocated",
        "rank-memory--reserved",
        "rank-memory--free",
        "rank-memory--nvml",
        "rank-memory--oom",
        "rank-memory--muted",
    }

    DEFAULT_CSS = """
    RankMemory {
        text-wrap: nowrap;
        text-overflow: ellipsis;
        height: auto;
    }
    """

    rows: reactive[tuple[RankMemoryRow, ...]] = reactive((), layout=True)
    """One entry per rank, from the latest run snapshot."""

    def __init__(self, id: str | None = None, classes: str | None = None) -> None:
        super().__init__(id=id, classes=classes)
        self.border_title = "Memory per rank"

    def show(self, state: RunState) -> None:
        self.rows = rank_rows(state)

    def render(self) -> Text:
        if not self.rows:
            return Text("waiting for the ranks…", style=self.get_component_rich_style("rank-memory--muted"))
        width = self.size.width or 40
        layout = "wide" if width >= 44 else "two-line" if len(self.rows) <= 4 else "one-line"
        out = Text(no_wrap=True, overflow="ellipsis")
        top = max((r.peak or r.reserved or r.allocated or r.host_rss or 0) for r in self.rows) or 1
        for i, row in enumerate(self.rows):
            if i:
                out.append("\n")
            self._render_row(out, row, width, layout, top)
        return out

    def _render_row(self, out: Text, row: RankMemoryRow, width: int, layout: str, top: int) -> None:
        """wide: label, allocator bar and figures, NVML bar; two-line: label + figures, bar; one-line: all in one."""
        style = self.get_component_rich_style
        start = len(out.plain)
        out.append(f"r{row.rank}", style("rank-memory--label"))
        if layout == "wide":
            out.append(f" {row.device}" + (f" pid {row.pid}" if row.pid else ""), style("rank-memory--muted"))
        if row.oom:
            out.append(" ✗ OOM", style("rank-memory--oom"))
        elif row.exit and row.exit != "ok":
            out.append(f" ✗ {row.exit}", style("rank-memory--oom"))
        elif row.exit == "ok":
            out.append(" ✓", style("rank-memory--muted"))
        if row.allocated is not None:
            whole = row.limit or (row.gpu.total if row.gpu else None) or row.peak or row.reserved or 1
            figures = f"{short_bytes(row.allocated)}/{short_bytes(whole)}"
        else:
            whole, figures = top, f"rss {short_bytes(row.host_rss)}"
        if layout == "one-line":
            out.append(" ")
            self._bar(out, row, whole, top, max(4, width - (len(out.plain) - start) - len(figures) - 2))
            out.append(" " + figures)
            return
        if layout == "two-line":
            out.append("  " + figures + "\n ")
            self._bar(out, row, whole, top, max(4, width - 2))
            return
        out.append("\n  ")
        self._bar(out, row, whole, top, max(6, min(40, width - 4)))
        if row.allocated is not None:
            of = f"{short_bytes(row.limit)} limit" if row.limit else short_bytes(whole)
            out.append(
                f"\n  alloc {short_bytes(row.allocated)} · resv {short_bytes(row.reserved)}"
                f" · peak {short_bytes(row.peak)} of {of}"
            )
        else:
            out.append(f" {figures}")
        if row.gpu is not None:
            g = row.gpu
            filled, empty = bar(fraction(g.used, g.total), max(6, min(40, width - 26)))
            out.append(f"\n  GPU{g.index} ", style("rank-memory--nvml"))
            out.append(filled, style("rank-memory--nvml"))
            out.append(empty, style("rank-memory--free"))
            out.append(f" {short_bytes(g.used)}/{short_bytes(g.total)} NVML")

    def _bar(self, out: Text, row: RankMemoryRow, whole: int, top: int, width: int) -> None:
        """Allocated █ within reserved ▒ within the limit ░; CPU ranks: their RSS history."""
        style = self.get_component_rich_style
        if row.allocated is None:
            out.append(sparkline(row.history, width, maximum=top), style("rank-memory--allocated"))
            return
        a, r, f = split_bar(fraction(row.allocated, whole), fraction(row.reserved, whole), width)
        out.append(a, style("rank-memory--allocated"))
        out.append(r, style("rank-memory--reserved"))
        out.append(f, style("rank-memory--free"))
