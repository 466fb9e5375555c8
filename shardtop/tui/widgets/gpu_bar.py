"""``GpuBar``: one GPU on one line — memory bar, utilisation, temperature, power, history, who is on it."""

from __future__ import annotations

from collections.abc import Mapping

from rich.style import Style
from rich.text import Text
from textual.reactive import reactive

from shardtop.rundir.memory_figures import GpuMemory
from shardtop.tui.format import bar, fraction, gpu_line_parts, short_run_id, sparkline, truncate
from shardtop.tui.repaint import PiecedLine
from shardtop.tui.watch.run_catalog import RankOwner

SPARK_WIDTH = 16


def memory_spark(history: tuple[int, ...], total: int) -> str:
    """The sparkline of a GPU's used memory, on an absolute scale like the bar (steady at 2 % reads low)."""
    return sparkline(history, SPARK_WIDTH, maximum=total)


def owners_text(pids: list[int], owners: Mapping[int, RankOwner]) -> str:
    """``run 2026…-3fa1 r0 (pid 4309)``, or the bare pids when no run owns them."""
    parts = []
    for pid in pids:
        owner = owners.get(pid)
        if owner is not None:
            parts.append(f"{short_run_id(owner.run_id)} r{owner.rank} pid {pid}")
        else:
            parts.append(f"pid {pid}")
    return ", ".join(parts)


HIGH = 0.9
"""Memory use from which the bar is drawn as a warning."""
GIB = 1024**3


FIELDS = ("head", "bar", "memory", "figures", "history", "owner")
"""The pieces of a GPU line, left to right.

A changed piece is resent from its own first cell to its last changed cell, each
time with a move and its colours (about 30 bytes).  Utilisation, temperature
and power move together on most samples, so they are one piece: a sample
resends their 17 cells once, not three short runs of cells with 30 bytes each."""


def figures(gpu: GpuMemory, parts: Mapping[str, str], muted: Style, wide: bool) -> Text:
    """Utilisation, then (on a wide line) temperature and power, each muted where NVML gave none.

    The gap before the history ends this piece: a new history resends from its own first cell."""
    util = Text(parts["util"], muted if gpu.util is None else "")
    if not wide:
        return util
    return Text.assemble(
        util,
        ("  " + parts["temperature"], muted if gpu.temperature is None else ""),
        ("  " + parts["power"] + "  ", muted if gpu.power_w is None else ""),
    )


class GpuBar(PiecedLine):
    """A single GPU's line in the ``GpuPanel``; a new sample repaints only the pieces, and cells, it changed."""

    COMPONENT_CLASSES = {
        "gpu-bar--label",
        "gpu-bar--used",
        "gpu-bar--high",
        "gpu-bar--free",
        "gpu-bar--history",
        "gpu-bar--owner",
        "gpu-bar--muted",
    }

    DEFAULT_CSS = """
    GpuBar {
        width: 1fr;
    }
    """

    PIECES = len(FIELDS)

    gpu: reactive[GpuMemory | None] = reactive(None, repaint=False)
    """The latest NVML sample of this GPU."""
    spark: reactive[str] = reactive("", repaint=False)
    """Memory over time as drawn (16 cells); compared as drawn, so a longer history alone repaints nothing."""
    owners: reactive[str] = reactive("", repaint=False)
    """Which run/rank/pid is on this GPU, in words."""
    owner_room: reactive[int] = reactive(0, repaint=False)
    """Cells the panel keeps for the owners on every line (the longest), so that bars and figures line up."""

    def show(self, gpu: GpuMemory, spark: str, owners: str, owner_room: int) -> None:
        """Take a new sample; the terminal gets only the cells that differ from what it shows."""
        self.gpu, self.spark, self.owners, self.owner_room = gpu, spark, owners, owner_room
        self.lay_out()

    def pieces(self) -> list[Text]:
        """The line's pieces, one per name in ``FIELDS``."""
        gpu = self.gpu
        if gpu is None:
            return [Text() for _ in FIELDS]
        width = self.size.width or 80
        parts = gpu_line_parts(gpu, width)
        label = self.get_component_rich_style("gpu-bar--label")
        muted = self.get_component_rich_style("gpu-bar--muted")
        frac = fraction(gpu.used, gpu.total)
        wide = width >= 100
        fixed = 3 + len(parts["name"]) + 1 + len(parts["memory"]) + 2 + 5 + (6 + 7 + 22 if wide else 0)
        owner_width = max(0, min(40, self.owner_room, width - fixed - 12))
        bar_width = max(8, min(48, width - fixed - owner_width - 2))
        filled, empty = bar(frac, bar_width)
        used_style = self.get_component_rich_style("gpu-bar--high" if frac >= HIGH else "gpu-bar--used")
        return [
            Text.assemble((parts["index"] + " ", label), (parts["name"] + " ", label)),
            Text.assemble((filled, used_style), (empty, self.get_component_rich_style("gpu-bar--free"))),
            Text(" " + parts["memory"] + "  "),
            figures(gpu, parts, muted, wide),
            Text(self.spark, self.get_component_rich_style("gpu-bar--history")) if wide else Text(),
            Text.assemble(
                "  ",
                (truncate(self.owners, max(owner_width, 10)), self.get_component_rich_style("gpu-bar--owner")),
            )
            if self.owners
            else Text(),
        ]
