"""``GpuPanel``: one ``GpuBar`` per GPU, kept in step with NVML by GPU index; unchanged cells are not resent."""

from __future__ import annotations

from collections.abc import Mapping

from textual.containers import Vertical
from textual.widgets import Static

from shardtop.tui.format import short_run_id
from shardtop.tui.repaint import set_border_text
from shardtop.tui.watch.gpu_feed import GpuSnapshot
from shardtop.tui.watch.run_catalog import RankOwner
from shardtop.tui.widgets.gpu_bar import GpuBar, memory_spark


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


class GpuPanel(Vertical):
    """The GPUs of this machine; says once, plainly, when there are none."""

    DEFAULT_CSS = """
    GpuPanel {
        height: auto;
    }
    GpuPanel > .gpu-panel--notice {
        height: auto;
    }
    """

    def __init__(self, id: str | None = None, classes: str | None = None) -> None:
        super().__init__(id=id, classes=classes)
        self.border_title = "GPUs"
        self._notice: Static | None = None
        self._notice_text = ""

    def show(self, snapshot: GpuSnapshot, owners: Mapping[int, RankOwner]) -> None:
        """Update, add or remove one bar per GPU; never rebuild the ones that stay."""
        if snapshot.unavailable and not snapshot.gpus:
            self._show_notice(
                f"No NVIDIA GPU here ({snapshot.unavailable}). Showing the host's CPU and memory, "
                "and the ranks' own memory, instead."
            )
        elif not snapshot.gpus:
            self._show_notice("NVML sees no GPUs (CUDA_VISIBLE_DEVICES or a container may hide them).")
        elif self._notice is not None:
            self._notice.remove()
            self._notice = None
        seen = set()
        words = {gpu.index: owners_text(gpu.pids, owners) for gpu in snapshot.gpus}
        room = max((len(w) for w in words.values()), default=0)
        for gpu in snapshot.gpus:
            key = f"gpu-{gpu.index}"
            seen.add(key)
            bars = self.query(f"#{key}")
            if bars:
                gpu_bar = bars.first(GpuBar)
            else:
                gpu_bar = GpuBar(id=key)
                self.mount(gpu_bar)
            gpu_bar.show(gpu, memory_spark(snapshot.history.get(gpu.index, ()), gpu.total), words[gpu.index], room)
        for gpu_bar in self.query(GpuBar):
            if gpu_bar.id not in seen:
                gpu_bar.remove()
        count = len(snapshot.gpus)
        set_border_text(self, title=f"GPUs ({count})" if count else "GPUs")

    def _show_notice(self, text: str) -> None:
        if self._notice is None:
            self._notice = Static(text, classes="gpu-panel--notice")
            self.mount(self._notice)
        elif self._notice_text != text:
            self._notice.update(text)
        self._notice_text = text
