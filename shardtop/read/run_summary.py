"""One line about a run, for ``shardtop runs`` and the TUI's run list: rendered from the read model."""

from __future__ import annotations

import time
from dataclasses import dataclass

from shardtop.read.run_model import RunModel
from shardtop.read.whole_run import read_run
from shardtop.rundir.run_config import RehearsalConfig
from shardtop.rundir.run_directory import RunDirectory
from shardtop.rundir.run_status import RunState


@dataclass(frozen=True)
class RunSummary:
    id: str
    title: str
    """The preset, or what a script run is."""
    state: RunState
    """The run's status word."""
    status: str
    """The status in words, with the exit code or signal."""
    ranks: int
    hosts: tuple[str, ...]
    step: int
    started: str
    note: str
    rehearsal: RehearsalConfig | None = None
    """Set for a rehearsal: ``ranks`` is then how many of its rehearsed ranks reported."""

    @property
    def ranks_short(self) -> str:
        """``4``, or ``2/8`` for two ranks of an 8-rank job rehearsed; ``-`` before any rank said."""
        if self.rehearsal is not None:
            return f"{len(self.rehearsal.ranks)}/{self.rehearsal.world_size}"
        return str(self.ranks or "-")

    @property
    def ranks_cell(self) -> str:
        """``ranks_short``, with ``rehearsed`` after it for a rehearsal: ``2/8 rehearsed``."""
        return self.ranks_short + (" rehearsed" if self.rehearsal is not None else "")


def summarize(run: RunDirectory, model: RunModel | None = None) -> RunSummary:
    """``model``: the run already read (the TUI follows live runs incrementally)."""
    m = model if model is not None else read_run(run)
    created = m.meta.created or m.state.first_t
    return RunSummary(
        id=run.id,
        title=m.meta.title,
        state=m.status.state if m.status is not None else "lost",
        status=m.status_text,
        ranks=len(m.ranks) or m.meta.config.world_size,
        hosts=m.hosts,
        step=m.step,
        started=time.strftime("%Y-%m-%d %H:%M", time.localtime(created)) if created else "?",
        note=m.summary_note,
        rehearsal=m.rehearsal,
    )
