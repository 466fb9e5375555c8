"""One line about a run, for ``shardtop runs`` and the TUI's run list."""

from __future__ import annotations

import time
from dataclasses import dataclass

from shardtop.config import format_bytes
from shardtop.events import read_all
from shardtop.run_state import RunState, fold
from shardtop.runs import RunDirectory


@dataclass(frozen=True)
class RunSummary:
    id: str
    preset: str
    status: str
    ranks: int
    step: int
    started: str
    note: str


def summarize(run: RunDirectory, state: RunState | None = None) -> RunSummary:
    """``state``: the run's events already folded (the TUI follows live runs incrementally)."""
    meta = run.read_meta()
    if state is None:
        events, skipped = read_all(run.events_dir)
        state = fold(events, sum(skipped.values()))
    created = meta.get("created")
    started = time.strftime("%Y-%m-%d %H:%M", time.localtime(created)) if created else "?"
    note = ""
    if state.ooms:
        oom = state.ooms[0]
        where = f" in {oom.module}" if oom.module else ""
        asked = f" ({format_bytes(oom.requested_bytes)} requested)" if oom.requested_bytes else ""
        note = f"OOM on rank {oom.rank} during {oom.phase}{where}{asked}"
    elif state.skipped:
        note = f"{state.skipped} unreadable event line(s)"
    return RunSummary(
        id=run.id,
        preset=str(meta.get("preset", "?")),
        status=run.status().describe(),
        ranks=len(state.ranks) or int(meta.get("config", {}).get("world_size", 0) or 0),
        step=state.step,
        started=started,
        note=note,
    )
