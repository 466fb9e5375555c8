"""The runs an exporter follows: the ones named, or every run of the runs directory while it runs.

Each run is read incrementally (``RunFollower``), as the TUI reads it.  Unnamed, a run is followed from
the first refresh that finds it running, and kept ``KEPT_AFTER_END_S`` after it ended, so that a scrape
sees how it ended (finished, out of memory, stopped) before its series go; a run that had ended before the
exporter started is not exported unless named.  The diagnosis runs again only when the run's model changed.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from shardtop.diagnose import Finding, diagnose
from shardtop.read.follower import RunFollower
from shardtop.read.run_model import RunModel
from shardtop.rundir.run_directory import RunDirectory, find_run, list_runs

KEPT_AFTER_END_S = 300.0
"""How long an unnamed run stays exported once it ended: several scrapes at any usual scrape interval."""


@dataclass
class FollowedRun:
    """One run being followed, and its findings for the model they were made from."""

    run: RunDirectory
    follower: RunFollower
    ended_at: float | None = None
    """When (monotonic seconds) a refresh first found the run ended; None while it runs."""
    _diagnosed: RunModel | None = None
    _findings: tuple[Finding, ...] = ()

    def refresh(self) -> RunModel:
        self.follower.poll()
        return self.follower.model()

    def findings(self, model: RunModel) -> tuple[Finding, ...]:
        if model is not self._diagnosed:
            self._findings, self._diagnosed = tuple(diagnose(model)), model
        return self._findings


@dataclass
class FollowedRuns:
    """The runs to export, refreshed once per interval."""

    root: Path
    named: tuple[RunDirectory, ...] = ()
    clock: Callable[[], float] = time.monotonic
    _runs: dict[Path, FollowedRun] = field(default_factory=dict)

    @classmethod
    def of(cls, root: Path, refs: Sequence[str]) -> FollowedRuns:
        """``refs``: run ids, unique parts of them or run directories (``find_run``); none: the running runs.
        An unknown one raises ``RunError`` (the command's exit 2)."""
        return cls(root, tuple(find_run(root, ref) for ref in refs))

    def refresh(self) -> list[tuple[FollowedRun, RunModel]]:
        """Each run followed, with its model as it stands now, in the order they were first followed."""
        now = self.clock()
        if self.named:
            wanted = list(self.named)
        else:
            new = [r for r in list_runs(self.root) if r.path not in self._runs and r.status().state == "running"]
            wanted = [f.run for f in self._runs.values()] + new
        found = []
        for run in wanted:
            followed = self._runs.get(run.path)
            if followed is None:
                followed = self._runs[run.path] = FollowedRun(run, RunFollower(run))
            model = followed.refresh()
            if model.running is False and followed.ended_at is None:
                followed.ended_at = now
            if not self.named and followed.ended_at is not None and now - followed.ended_at > KEPT_AFTER_END_S:
                del self._runs[run.path]
                continue
            found.append((followed, model))
        return found
