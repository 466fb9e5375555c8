"""``RankMemory``: each rank's memory — allocator allocated/reserved/peak vs its limit, and NVML.

A run over several hosts is drawn host by host: a line naming the host above
its ranks, or, past ``HOST_LINES_FROM`` ranks, one line per host summing its
ranks up (lowest…highest allocation, the worst status), so 512 ranks take 64
lines; when those do not fit, the worst hosts come first and the last line sums
up the rest (``host_memory.host_lines``).

Where the probe split a rank's allocated memory by kind (``RankFacts.memory_now``),
its bar stacks the kinds, then the allocator's cache and memory outside PyTorch,
each in its colour, with the rank's peak marked (``memory_bar``); a legend says
the kinds' sizes where there is room.  Without a split (older recordings) the
bar is allocated █ within reserved ▒ within the limit ░.  A CPU rank's bar is
its resident memory (rss) █ of its host's memory ░, to an eighth of a cell; a
cap on CPU limits the data segment, not rss, and is said in words under the
bars (``bar_scale.cpu_cap_words``).
"""

from __future__ import annotations

from rich.text import Text
from textual.geometry import Size
from textual.reactive import reactive

from shardtop.read.rank_facts import RankStatus
from shardtop.read.run_model import RunModel
from shardtop.rundir.memory_figures import GpuMemory
from shardtop.tui.bar_scale import cpu_cap_words, scale_title
from shardtop.tui.format import bar, fraction, split_bar
from shardtop.tui.host_groups import by_host, rank_spans
from shardtop.tui.host_memory import HOST_LINES_FROM, host_lines, host_memory_rows
from shardtop.tui.memory_bar import PEAK, BarRun, LegendEntry, zoom_of
from shardtop.tui.over_time import GROWS, over_time_line
from shardtop.tui.rank_memory_rows import RankMemoryRow, rank_rows
from shardtop.tui.repaint import PaintsChanges
from shardtop.tui.stacked_bar import bar_legend, stacked_bar, zoom_words
from shardtop.units import short_bytes

STATUS_WORDS = {"out of memory": "OOM"}
"""Rank states said shorter beside a bar."""


Shape = tuple[tuple[str, bool, bool, bool, bool, bool], ...]


def line_shape(rows: tuple[RankMemoryRow, ...]) -> Shape:
    """What decides how many lines the bars take (at one width): the ranks' hosts, allocator, NVML figures,
    splits (a stacked bar has a legend), lines over time and caps said in words (CPU)."""
    return tuple((r.host, r.on_cpu, r.gpu is None, r.stacked, r.over_time, bool(r.on_cpu and r.limit)) for r in rows)


def cpu_caps(rows: tuple[RankMemoryRow, ...]) -> list[int]:
    """The caps of the CPU ranks that have one."""
    return [r.limit for r in rows if r.on_cpu and r.limit]


LEGEND_LINES = {"wide": 1, "tall": 1}
"""Lines of legend under a stacked bar, by layout (the other layouts have no room); a rank alone in
the tall layout gets two."""
WIDE_LEGEND_RANKS = 4
"""Up to this many ranks keep their legend in the wide layout (more would push ranks off the panel)."""


def memory_layout(width: int, ranks: int) -> str:
    """How many lines a rank gets: wide (3-4, with words), tall (4, narrow), two-line, or one-line.

    Narrow, the panel has 8 lines: one or two ranks get the figures and the NVML
    bar too, up to four ranks a bar each, more ranks one line each.
    """
    if width >= 44:
        return "wide"
    return "tall" if ranks <= 2 else "two-line" if ranks <= 4 else "one-line"


class RankMemory(PaintsChanges):
    """Per-rank memory bars; one line per rank when narrow, three when wide.

    New figures repaint only the cells that changed (``PaintsChanges``): with
    hundreds of ranks, most of the panel stays as it is from one second to the next.
    """

    COMPONENT_CLASSES = {
        "rank-memory--label",
        "rank-memory--allocated",
        "rank-memory--reserved",
        "rank-memory--free",
        "rank-memory--nvml",
        "rank-memory--oom",
        "rank-memory--muted",
        "rank-memory--params",
        "rank-memory--grads",
        "rank-memory--optimizer",
        "rank-memory--activations",
        "rank-memory--kept",
        "rank-memory--script",
        "rank-memory--comm",
        "rank-memory--workspace",
        "rank-memory--other",
        "rank-memory--unexplained",
        "rank-memory--cache",
        "rank-memory--outside",
        "rank-memory--small",
        "rank-memory--peak",
        "rank-memory--steps",
        "rank-memory--growth",
        "rank-memory--stalled",
    }

    DEFAULT_CSS = """
    RankMemory {
        text-wrap: nowrap;
        text-overflow: ellipsis;
        height: auto;
    }
    """

    rows: reactive[tuple[RankMemoryRow, ...]] = reactive((), repaint=False)
    """One entry per rank, from the latest run snapshot."""

    def __init__(self, id: str | None = None, classes: str | None = None) -> None:
        super().__init__(id=id, classes=classes)
        self.border_title = "Memory per rank"
        self._drawn: tuple[tuple[object, ...], Text] | None = None
        self._shape: Shape = ()
        self._zoom = 1
        self._over_time = False

    def show(self, model: RunModel) -> None:
        """New figures repaint the bars; the screen is laid out again only when the bars need more or fewer lines."""
        rows = rank_rows(model)
        shape = line_shape(rows)
        reshaped, self._shape = shape != self._shape, shape
        self.rows = rows
        self._title()
        if reshaped:
            self.refresh(layout=True)
        else:
            self.repaint_changes()

    def on_resize(self) -> None:
        self._title()

    def _title(self) -> None:
        """``Memory per rank, of 23.5 GiB host memory``: what the bars measure against, where all share it."""
        width = self.size.width
        scales = [(r.whole, r.whole_words) for r in self.rows]
        scale = scale_title(scales)
        highest = bool(self.rows) and all(r.on_cpu and not r.whole for r in self.rows)
        if highest:  # no host's memory said: the bars measure against the highest rss
            scale = "of the highest rss"
        title = f"Memory per host ({len(self.rows)} ranks)" if self._per_host() else "Memory per rank"
        if scale and 0 < width < 44 and not self._per_host():  # narrow: what the bars measure against, not "per rank"
            title = f"Memory {scale}"
            if len(title) > width - 4:  # the border's corners and the spaces around the title
                title = "Memory vs highest rss" if highest else f"Memory {scale_title(scales, short=True)}"
        elif scale:
            title = f"{title}, {scale}"
        if title != self.border_title:
            self.border_title = title

    def notify_style_update(self) -> None:
        super().notify_style_update()
        self._drawn = None

    def get_content_height(self, container: Size, viewport: Size, width: int) -> int:
        """One line per host when summing up (the lines that do not fit are summed up in the last one)."""
        if self._per_host():
            return len({r.host for r in self.rows})
        return len(self._drawn_at(width, 0).split("\n", allow_blank=True))

    def _per_host(self) -> bool:
        return len(self.rows) >= HOST_LINES_FROM and len({r.host for r in self.rows}) > 1

    def draw(self) -> Text:
        size = self.size
        return self._drawn_at(size.width, size.height)

    def _drawn_at(self, width: int, height: int) -> Text:
        """The bars at ``width`` (and, a line per host, ``height``) cells, drawn once per new rows and size.

        A relayout asks for them twice, to measure and to paint.  Measuring passes the width it
        measures at: the widget's ``size`` is where the last layout put it, and asking for it in the
        middle of a layout makes Textual arrange the whole screen once more to answer."""
        key = (self.rows, width, height)
        if self._drawn is None or self._drawn[0] != key:
            self._drawn = (key, self._draw(width or 40, height))
        return self._drawn[1]

    def _draw(self, width: int, height: int) -> Text:
        if not self.rows:
            return Text("waiting for the ranks…", style=self.get_component_rich_style("rank-memory--muted"))
        groups = by_host(self.rows, lambda r: r.host)
        if len(groups) > 1 and len(self.rows) >= HOST_LINES_FROM:
            hosts = host_memory_rows(self.rows)
            room = height or len(hosts)
            return host_lines(hosts, width, self.get_component_rich_style, self._status, room)
        headings = len(groups) if len(groups) > 1 else 0
        layout = memory_layout(width, len(self.rows) + headings)
        out = Text(no_wrap=True, overflow="ellipsis")
        top = max((r.peak or r.reserved or r.allocated or r.host_rss or 0) for r in self.rows) or 1
        self._over_time = layout in ("wide", "tall") and len(self.rows) <= WIDE_LEGEND_RANKS
        labels = {row.rank: self._label(row, layout) for row in self.rows}
        self._zoom = zoom_of([(r.top, r.whole or 0) for r in self.rows if r.stacked])
        label_width = max(label.cell_len for label in labels.values())
        legend = LEGEND_LINES.get(layout, 0)
        if layout == "tall" and len(self.rows) == 1:
            legend = 2
        elif layout == "wide" and len(self.rows) > WIDE_LEGEND_RANKS:
            legend = 0
        lines = 0
        for host, group in groups:
            if headings:
                out.append("\n" if lines else "")
                out.append(host, self.get_component_rich_style("rank-memory--label"))
                spans = rank_spans([r.rank for r in group])
                out.append(f" {spans}", self.get_component_rich_style("rank-memory--muted"))
                lines += 1
            for row in group:
                out.append("\n" if lines else "")
                self._render_row(out, row, labels[row.rank], label_width, width, layout, top, legend)
                lines += 1
        caps = cpu_caps(self.rows)
        if caps and layout == "wide":  # the tall layout says it under each rank; the others have no room
            out.append("\n" + cpu_cap_words(caps), self.get_component_rich_style("rank-memory--muted"))
        return out

    def _label(self, row: RankMemoryRow, layout: str) -> Text:
        """``r0 cuda:0 pid 644 ✗ OOM`` (wide) or ``r0 ✗ OOM``: which rank, and how it ended, in words; with no
        line over time under the bar, ``↗ grows`` where its memory grows every step."""
        style = self.get_component_rich_style
        out = Text()
        out.append(f"r{row.rank}", style("rank-memory--label"))
        if layout == "wide":
            out.append(f" {row.device}" + (f" pid {row.pid}" if row.pid else ""), style("rank-memory--muted"))
        self._status(out, row.status)
        if row.growth is not None and not self._over_time and not row.status.ended:
            out.append(f" {GROWS} grows", style("rank-memory--growth"))
        return out

    def _status(self, out: Text, status: RankStatus) -> None:
        """`` ✓`` once finished, `` ✗ OOM`` and the like once ended otherwise, `` ‖ stalled`` while it has
        stopped moving; nothing while running."""
        style = self.get_component_rich_style
        if status.state == "finished":
            out.append(f" {status.mark}", style("rank-memory--muted"))
        elif status.state == "stalled":
            out.append(f" {status.mark} stalled", style("rank-memory--stalled"))
        elif status.ended:
            word = STATUS_WORDS.get(status.state, status.state)
            out.append(f" {status.mark} {word}", style("rank-memory--oom"))

    def _render_row(
        self, out: Text, row: RankMemoryRow, label: Text, label_width: int, width: int, layout: str, top: int,
        legend: int,
    ) -> None:
        """One rank's lines in ``layout`` (``memory_layout``); one-line labels padded to ``label_width``;
        ``legend``: lines of legend under a stacked bar."""
        out.append_text(label)
        if not row.on_cpu:
            whole = row.whole or 1
            figures = f"{short_bytes(row.allocated)}/{short_bytes(whole)}"
        else:
            whole = row.whole or top
            rss = short_bytes(row.host_rss or None)  # 0: no sample yet
            figures = f"rss {rss}" + (f"/{short_bytes(row.whole)}" if row.whole else "")
        legend = legend if row.stacked else 0
        if layout == "one-line" or (layout == "wide" and row.on_cpu):
            # a CPU rank has one figure (its rss): label, bar and figure fit one line even when wide
            out.append(" " * (label_width - label.cell_len + 1))
            self._bar(out, row, whole, top, max(4, min(40, width - label_width - len(figures) - 2)))
            out.append(" " + figures)
            self._steps(out, row, width, "  ")
            return
        if layout in ("two-line", "tall"):
            out.append("  " + figures + "\n ")
            runs = self._bar(out, row, whole, top, max(4, width - 2))
            if legend:
                peak = LegendEntry("peak", PEAK, row.peak) if row.peak else None
                bar_legend(out, row.parts, runs, max(4, width - 2), legend, " ", peak, self.get_component_rich_style)
            elif layout == "tall" and not row.on_cpu:
                out.append(f"\n resv {short_bytes(row.reserved)} · peak {short_bytes(row.peak)}")
            elif layout == "tall" and row.limit:
                muted = self.get_component_rich_style("rank-memory--muted")
                out.append("\n " + cpu_cap_words([row.limit], short=True), muted)
            self._steps(out, row, width, " ")
            if layout == "tall" and row.gpu is not None:
                self._nvml(out, row.gpu, max(4, width - 19), " ", "")
            return
        out.append("\n  ")
        longest = 40 + (len(zoom_words(self._zoom, True)) if row.stacked else 0)  # the zoom's words beside 40 cells
        runs = self._bar(out, row, whole, top, max(6, min(longest, width - 4)))
        if legend:
            bar_legend(out, row.parts, runs, max(6, width - 2), legend, "  ", None, self.get_component_rich_style)
        self._steps(out, row, width, "  ")
        of = f"{short_bytes(row.limit)} limit" if row.limit else short_bytes(whole)
        out.append(f"\n  alloc {short_bytes(row.allocated)} · resv {short_bytes(row.reserved)} · ")
        if row.stacked and row.peak:
            out.append(PEAK, self.get_component_rich_style("rank-memory--peak"))
        out.append(f"peak {short_bytes(row.peak)} of {of}")
        if row.gpu is not None:
            self._nvml(out, row.gpu, max(6, min(40, width - 26)), "  ", " NVML")

    def _steps(self, out: Text, row: RankMemoryRow, width: int, indent: str) -> None:
        """The line over time under the bar, where the layout has room for it."""
        if self._over_time and row.over_time:
            over_time_line(out, row.steps, row.growth, row.status, width, indent, self.get_component_rich_style)

    def _nvml(self, out: Text, g: GpuMemory, width: int, indent: str, suffix: str) -> None:
        """What NVML saw on the rank's GPU: the allocator's figures plus the CUDA context and everyone else."""
        style = self.get_component_rich_style
        filled, empty = bar(fraction(g.used, g.total), width)
        out.append(f"\n{indent}GPU{g.index} ", style("rank-memory--nvml"))
        out.append(filled, style("rank-memory--nvml"))
        out.append(empty, style("rank-memory--free"))
        out.append(f" {short_bytes(g.used)}/{short_bytes(g.total)}{suffix}")

    def _bar(self, out: Text, row: RankMemoryRow, whole: int, top: int, width: int) -> tuple[BarRun, ...]:
        """Stacked by kind (``_stacked``: returns its runs); else allocated █ within reserved ▒ within
        the limit ░; CPU ranks: their rss █ (to an eighth of a cell) of ``whole`` (the host's memory) ░."""
        style = self.get_component_rich_style
        if row.on_cpu:
            filled, empty = bar(fraction(row.host_rss, whole), width)
            out.append(filled, style("rank-memory--allocated"))
            out.append(empty, style("rank-memory--free"))
            return ()
        if row.stacked:
            zoom = zoom_words(self._zoom, words=width >= 30)
            scale = max(1, whole // self._zoom)
            return stacked_bar(out, row.parts, row.peak, scale, width, zoom, self.get_component_rich_style)
        a, r, f = split_bar(fraction(row.allocated, whole), fraction(row.reserved, whole), width)
        out.append(a, style("rank-memory--allocated"))
        out.append(r, style("rank-memory--reserved"))
        out.append(f, style("rank-memory--free"))
        return ()
