"""What a run's header says, read off the read model: the run view's ``RunHeader`` and ``attach``'s
plain first frame say it in the same words.  Pure: no Textual."""

from __future__ import annotations

from dataclasses import dataclass

from shardtop.read.rank_facts import RANK_MARKS
from shardtop.read.run_model import RunModel
from shardtop.rundir.run_directory import RunDirectory
from shardtop.rundir.run_status import RunState
from shardtop.tui.format import STATUS_MARKS, short_path
from shardtop.words import noun, plural

Part = tuple[str, str]
"""A piece of a header line and the component class that styles it ("" for none)."""


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


def run_header_info(model: RunModel, run: RunDirectory) -> HeaderInfo:
    """The header of ``run`` as ``model`` (read with the run's status) stands."""
    m = model
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
    status = m.status
    assert status is not None, "a header is read with the run's status"
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
        run_id=run.id,
        path=short_path(run.path),
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


def header_parts(info: HeaderInfo, elapsed: str) -> tuple[list[Part], list[Part]]:
    """The header's two lines as pieces, each with the component class of ``RunHeader`` that styles it."""
    engine = info.engine + (f" ({info.strategy})" if info.strategy else "") + (f", {info.held}" if info.held else "")
    mark = STATUS_MARKS.get(info.state, "·")
    line1: list[Part] = [
        (info.preset, "run-header--title"),
        ("  ", ""),
        (f"{mark} {info.status}", "run-header--status"),
        (f"  {info.stalled}" if info.stalled else "", "run-header--status"),
        ("  ", ""),
        ("elapsed ", "run-header--label"),
        (elapsed or "-", ""),
        ("  ", ""),
        (engine, ""),
    ]
    line2: list[Part] = [
        (info.ranks, "run-header--status" if info.rehearsal else ""),
        ("  ", ""),
        ("step ", "run-header--label"),
        (str(info.step), ""),
        ("  ", ""),
        ("phase ", "run-header--label"),
        (info.phase, ""),
        ("  ", ""),
        (info.run_id, "run-header--muted"),
        ("  ", ""),
        (info.path, "run-header--muted"),
    ]
    if info.skipped:
        line2.append((f"  ⚠ {info.skipped} unreadable event line(s) skipped", "run-header--status"))
    return line1, line2
