"""``GpuPanel``: one ``GpuBar`` per GPU, kept in step with NVML by GPU index; unchanged cells are not resent.

Under this machine's GPUs, ``RemoteGpus`` shows the GPUs other hosts' ranks report.
"""

from __future__ import annotations

from collections.abc import Mapping

from textual.app import ComposeResult
from textual.containers import Vertical
from textual.widgets import Static

from shardtop.tui.repaint import set_border_text
from shardtop.tui.watch.gpu_feed import GpuSnapshot
from shardtop.tui.watch.run_catalog import HostGpus, RankOwner
from shardtop.tui.widgets.gpu_bar import GpuBar, memory_spark, owners_text
from shardtop.tui.widgets.remote_gpus import RemoteGpus
from shardtop.words import noun


def panel_title(here: int, remote: tuple[HostGpus, ...]) -> str:
    """``GPUs (2)``, ``GPUs (2 here · 16 on 2 other hosts)``, ``GPUs (16 on 2 hosts)``."""
    there = sum(len(h.gpus) for h in remote)
    if not remote:
        return f"GPUs ({here})" if here else "GPUs"
    hosts = f"{len(remote)} {'other ' if here else ''}{noun(len(remote), 'host')}"
    return f"GPUs ({here} here · {there} on {hosts})" if here else f"GPUs ({there} on {hosts})"


class GpuPanel(Vertical):
    """The GPUs of this machine, then those other hosts report; says once, plainly, when there are none here."""

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

    def compose(self) -> ComposeResult:
        yield RemoteGpus()

    def show(
        self, snapshot: GpuSnapshot, owners: Mapping[int, RankOwner], remote: tuple[HostGpus, ...] = ()
    ) -> None:
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
                self.mount(gpu_bar, before=self.query_one(RemoteGpus))
            gpu_bar.show(gpu, memory_spark(snapshot.history.get(gpu.index, ()), gpu.total), words[gpu.index], room)
        for gpu_bar in self.query(GpuBar):
            if gpu_bar.id not in seen:
                gpu_bar.remove()
        self.query_one(RemoteGpus).show(remote)
        set_border_text(self, title=panel_title(len(snapshot.gpus), remote))

    def _show_notice(self, text: str) -> None:
        if self._notice is None:
            self._notice = Static(text, classes="gpu-panel--notice")
            self.mount(self._notice, before=self.query_one(RemoteGpus))
        elif self._notice_text != text:
            self._notice.update(text)
        self._notice_text = text
