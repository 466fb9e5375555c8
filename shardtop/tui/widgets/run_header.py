"""``RunHeader``: what the run is and where it stands, in two lines."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from rich.text import Text
from textual.reactive import reactive

from shardtop.read.rank_facts import RANK_MARKS
from shardtop.rundir.run_status import RunState
from shardtop.tui.format import STATUS_MARKS, duration, short_path
from shardtop.tui.repaint import PaintsChanges
from shardtop.tui.watch.run_feed import RunSnapshot
from shardtop.words import noun, plural


@dataclass(frozen=True)
class HeaderInfo:
    """The header's facts; compared whole, so an unchanged header is not repainted."""

    preset: str
    engine: str
    strategy: str
    held: str
    """How the shards say the model is held, where that differs from the engine (story 2's set-up)."""
    ranks: str
    """How many ranks on which hosts; for a rehearsal, which ranks of the job, rehearsed on what."""
    rehearsal: bool
    step: int
    phase: str
    status: str
    state: RunState
    run_id: str
    path: str
    started: float | None
    ended: float | None
    skipped: int
    stalled: str = ""
    """``‖ rank 0 stalled`` while ranks have stopped moving in a run that still runs; else empty."""


def header_info(snap: RunSnapshot) -> HeaderInfo:
    m = snap.model
    up = len(m.ranks)
    world = m.world_size
    ranks = f"{up}/{world} ranks" if world and up != world else plural(up or world, "rank")
    hosts = m.hosts
    if m.rehearsal is not None:
        ranks = m.rehearsal.headline
    elif hosts:
        ranks += f" on {', '.join(hosts[:3])}" + (f" +{len(hosts) - 3}" if len(hosts) > 3 else "")
    phases = {r.state.phase for r in m.ranks if r.state.phase}
    phase = phases.pop() if len(phases) == 1 else ("/".join(sorted(phases)) if phases else "-")
    status = snap.status
    ended = status.exit.ended if status.exit is not None and status.state != "running" else None
    if ended is None and status.state != "running":
        ended = m.state.last_t
    return HeaderInfo(
        preset=m.meta.title,
        engine=m.engine or "-",
        strategy=m.strategy,
        held=f"held as {m.held_as}" if m.held_as else "",
        ranks=ranks,
        rehearsal=m.rehearsal is not None,
        step=m.step,
        phase=phase,
        status=m.status_text,
        state=status.state,
        run_id=snap.run.id,
        path=short_path(snap.run.path),
        started=m.meta.created or m.state.first_t,
        ended=ended,
        skipped=m.state.skipped + m.state.inconsistent,
        stalled=stalled_words(sorted(m.stalls)),
    )


def stalled_words(ranks: list[int]) -> str:
    """``‖ rank 0 stalled``, ``‖ ranks 0, 3 stalled``, ``‖ 12 ranks stalled``; empty for none."""
    if not ranks:
        return ""
    mark = RANK_MARKS["stalled"]
    if len(ranks) > 4:
        return f"{mark} {len(ranks)} ranks stalled"
    return f"{mark} {noun(len(ranks), 'rank')} {', '.join(map(str, ranks))} stalled"


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
        label = self.get_component_rich_style("run-header--label")
        muted = self.get_component_rich_style("run-header--muted")
        engine = (
            info.engine + (f" ({info.strategy})" if info.strategy else "") + (f", {info.held}" if info.held else "")
        )
        mark = STATUS_MARKS.get(info.state, "·")
        line1 = Text.assemble(
            (info.preset, self.get_component_rich_style("run-header--title")),
            "  ",
            (f"{mark} {info.status}", self.get_component_rich_style("run-header--status")),
            (f"  {info.stalled}" if info.stalled else "", self.get_component_rich_style("run-header--status")),
            "  ",
            ("elapsed ", label),
            self.elapsed or "-",
            "  ",
            engine,
            no_wrap=True,
            overflow="ellipsis",
        )
        line2 = Text.assemble(
            (info.ranks, self.get_component_rich_style("run-header--status")) if info.rehearsal else info.ranks,
            "  ",
            ("step ", label),
            str(info.step),
            "  ",
            ("phase ", label),
            info.phase,
            "  ",
            (info.run_id, muted),
            "  ",
            (info.path, muted),
            no_wrap=True,
            overflow="ellipsis",
        )
        if info.skipped:
            line2.append(
                f"  ⚠ {info.skipped} unreadable event line(s) skipped",
                self.get_component_rich_style("run-header--status"),
            )
        return Text("\n", no_wrap=True, overflow="ellipsis").join([line1, line2])
