"""``RemoteGpus``: the GPUs of other hosts, as the live runs' ranks report them.

Each host's local rank 0 samples its host's GPUs through NVML and writes them
as events, so a machine that watches a run over several hosts (a login node
without GPUs of its own, say) shows every host's GPUs, each line labelled with
its host.  When there are more GPUs than fit (a third of the screen's height),
one line per host says how many GPUs it has and how full the fullest is; past
that many hosts, the last line sums up the rest.
Drawn as one text; a new sample repaints only the cells it changed.
"""

from __future__ import annotations

from collections.abc import Sequence

from rich.text import Text
from textual.reactive import reactive

from shardtop.rundir.memory_figures import GpuMemory
from shardtop.tui.format import bar, fraction, gpu_line_parts, truncate
from shardtop.tui.repaint import PaintsChanges
from shardtop.tui.watch.run_catalog import HostGpus
from shardtop.tui.widgets.gpu_bar import GIB, HIGH, owners_text

HOST_WIDTH = 16
"""Cells a host name gets before it is cut."""


def lines_room(screen_height: int) -> int:
    """Lines other hosts' GPUs may take: a third of the screen, at least 4."""
    return max(4, screen_height // 3)


def gpu_lines_fit(gpus: int, screen_height: int) -> bool:
    """One line per GPU while they fit ``lines_room``; else one per host."""
    return gpus <= lines_room(screen_height)


def used_span(gpus: Sequence[GpuMemory]) -> str:
    """``61.2…78.0/140G``: the least and most used GPU of a host, of the largest."""
    low, high = min(g.used for g in gpus) / GIB, max(g.used for g in gpus) / GIB
    total = max(g.total for g in gpus) / GIB
    used = f"{low:.1f}" if f"{low:.1f}" == f"{high:.1f}" else f"{low:.1f}…{high:.1f}"
    return f"{used}/{total:.0f}G"


def util_span(gpus: Sequence[GpuMemory]) -> str:
    """``util 90…99%``, or nothing when NVML gave no utilisation."""
    utils = [g.util for g in gpus if g.util is not None]
    if not utils:
        return ""
    low, high = min(utils), max(utils)
    return f"util {low}%" if low == high else f"util {low}…{high}%"


class RemoteGpus(PaintsChanges):
    """Other hosts' GPUs: a line per GPU (``gpu-b  0 H200 ███░░ 17.1/139.8 GiB 97% … r2 pid 644``) or per host."""

    COMPONENT_CLASSES = {"gpu-bar--label", "gpu-bar--used", "gpu-bar--high", "gpu-bar--free", "gpu-bar--owner"}

    DEFAULT_CSS = """
    RemoteGpus {
        height: auto;
        text-wrap: nowrap;
        text-overflow: ellipsis;
    }
    """

    hosts: reactive[tuple[HostGpus, ...]] = reactive((), repaint=False)
    """One entry per other host, in name order."""

    def show(self, hosts: tuple[HostGpus, ...]) -> None:
        """Take the latest samples; only the cells that differ reach the terminal."""
        self.display = bool(hosts)
        if hosts != self.hosts:
            self.hosts = hosts
            self.repaint_changes()

    def draw(self) -> Text:
        width = self.size.width or 80
        hosts = self.hosts
        count = sum(len(h.gpus) for h in hosts)
        screen_height = self.screen.size.height if self.is_mounted else 48
        lines: list[Text] = []
        if gpu_lines_fit(count, screen_height):
            room = max((len(owners_text(g.pids, h.owners)) for h in hosts for g in h.gpus), default=0)
            label_width = min(HOST_WIDTH, max((len(h.host) for h in hosts), default=0))
            for h in hosts:
                lines += [self._gpu_line(h, g, label_width, width, room) for g in h.gpus]
        else:
            shown = lines_room(screen_height)
            if len(hosts) > shown:
                rest = hosts[shown - 1 :]
                gpus = tuple(g for h in rest for g in h.gpus)
                hosts = hosts[: shown - 1] + (HostGpus(f"+{len(rest)} hosts", "", gpus, {}),)
            label_width = min(HOST_WIDTH, max((len(h.host) for h in hosts), default=0))
            lines = [self._host_line(h, label_width, width) for h in hosts]
        return Text("\n", no_wrap=True, overflow="ellipsis").join(lines)

    def _bar(self, used: int, total: int, width: int) -> Text:
        frac = fraction(used, total)
        filled, empty = bar(frac, width)
        style = self.get_component_rich_style
        return Text.assemble(
            (filled, style("gpu-bar--high" if frac >= HIGH else "gpu-bar--used")), (empty, style("gpu-bar--free"))
        )

    def _gpu_line(self, h: HostGpus, gpu: GpuMemory, label_width: int, width: int, room: int) -> Text:
        """A GPU of another host, laid out as this machine's ``GpuBar`` lines are, after the host's name."""
        parts = gpu_line_parts(gpu, width)
        wide = width >= 100
        head = f"{truncate(h.host, label_width):<{label_width}} {parts['index']} {parts['name']} "
        figures = f" {parts['memory']}  {parts['util']}"
        if wide:
            figures += f"  {parts['temperature']}  {parts['power']}"
        owners = owners_text(gpu.pids, h.owners)
        owner_width = max(0, min(40, room, width - len(head) - len(figures) - 12))
        bar_width = max(8, min(48, width - len(head) - len(figures) - owner_width - 2))
        line = Text.assemble(
            (head, self.get_component_rich_style("gpu-bar--label")), self._bar(gpu.used, gpu.total, bar_width), figures
        )
        if owners:
            line.append("  " + truncate(owners, max(owner_width, 10)), self.get_component_rich_style("gpu-bar--owner"))
        return line

    def _host_line(self, h: HostGpus, label_width: int, width: int) -> Text:
        """``gpu-b 8 × H200 ████░░ 61.2…78.0/140G util 90…99%``: a host's GPUs, the fullest one's bar."""
        names = {truncate(g.name.replace("NVIDIA ", ""), 14 if width >= 100 else 8) for g in h.gpus}
        what = f"{len(h.gpus)} × {names.pop()}" if len(names) == 1 else f"{len(h.gpus)} GPUs"
        head = f"{truncate(h.host, label_width):<{label_width}} {what} "
        figures = f" {used_span(h.gpus)}  {util_span(h.gpus)}".rstrip()
        fullest = max(h.gpus, key=lambda g: fraction(g.used, g.total))
        bar_width = max(8, min(48, width - len(head) - len(figures)))
        return Text.assemble(
            (head, self.get_component_rich_style("gpu-bar--label")),
            self._bar(fullest.used, fullest.total, bar_width),
            figures,
        )
