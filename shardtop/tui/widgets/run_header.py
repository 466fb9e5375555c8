"""``RunHeader``: what the run is and where it stands, in two lines."""

from __future__ import annotations

import time
from collections.abc import Callable

from rich.text import Text
from textual.reactive import reactive

from shardtop.tui.format import duration
from shardtop.tui.header_info import HeaderInfo, header_parts, run_header_info, stalled_words
from shardtop.tui.repaint import PaintsChanges
from shardtop.tui.watch.run_feed import RunSnapshot

__all__ = ["HeaderInfo", "RunHeader", "header_info", "stalled_words"]


def header_info(snap: RunSnapshot) -> HeaderInfo:
    return run_header_info(snap.model, snap.run)


class RunHeader(PaintsChanges):
    """Preset, engine and strategy, ranks and hosts (or what a rehearsal rehearsed), step, phase, status, elapsed.

    The elapsed clock ticks every second: only its cells are repainted.
    """

    COMPONENT_CLASSES = {"run-header--title", "run-header--label", "run-header--status", "run-header--muted"}

    DEFAULT_CSS = """
    RunHeader {
        text-wrap: nowrap;
        text-overflow: ellipsis;
        height: 2;
    }
    """

    info: reactive[HeaderInfo | None] = reactive(None, repaint=False)
    """The facts shown; set from each run snapshot."""
    elapsed: reactive[str] = reactive("", repaint=False)
    """Time since the run started (frozen at its end), re-read every second."""

    def __init__(self, clock: Callable[[], float] = time.time, id: str | None = None) -> None:
        super().__init__(id=id)
        self._clock = clock

    def on_mount(self) -> None:
        self.set_interval(1.0, self._tick)

    def show(self, snap: RunSnapshot) -> None:
        self.info = info = header_info(snap)
        self.set_class(info.state in ("failed", "lost"), "-failed")
        self._tick()

    def _tick(self) -> None:
        info = self.info
        if info is None or info.started is None:
            self.elapsed = ""
            return
        end = info.ended if info.ended is not None else self._clock()
        self.elapsed = duration(max(0.0, end - info.started))

    def watch_info(self) -> None:
        self.repaint_changes()

    def watch_elapsed(self) -> None:
        self.repaint_changes()

    def draw(self) -> Text:
        info = self.info
        if info is None:
            return Text("reading the run directory…")
        style = self.get_component_rich_style
        line1, line2 = (
            Text.assemble(*((text, style(kind)) if kind else text for text, kind in parts), no_wrap=True,
                          overflow="ellipsis")
            for parts in header_parts(info, self.elapsed)
        )
        return Text("\n", no_wrap=True, overflow="ellipsis").join([line1, line2])
