"""What the ranks are doing before the run view has a module tree: each rank's phase and last log line.

An engine's set-up can take a minute before the probe sends the tree (DeepSpeed building its CPU
ops); the tree pane says meanwhile what each rank is doing: its phase, else its status, and, for a
rank still starting on this host, what its process is building (``rank_builds``); its log's last
line, or that its log is empty.  Read by the run feed, in its thread: the logs are files, and only
the feed touches the disk and the processes.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from shardtop.read.run_model import RunModel
from shardtop.read.whole_run import read_file_tail
from shardtop.rundir.cluster import host_name
from shardtop.rundir.run_directory import RunDirectory
from shardtop.tui.watch.rank_builds import ChildProcess, build_words, builds_under

SHOWN_RANKS = 8
"""Ranks told at most; a pane of a few lines has no room for more."""


@dataclass(frozen=True, slots=True)
class RankActivity:
    """One rank's (or one host's command's) latest doing: ``who`` is ``r0`` or a host's name."""

    who: str
    doing: str
    """Its phase or status (``setup``, ``starting``); empty for a host's command."""
    last_line: str
    """The last line its log has, empty where it has none yet."""
    own_log: bool = False
    """It has a log of its own (a rank of ``shardtop run`` writes to its host's command's)."""

    @property
    def words(self) -> str:
        log = f"last log line: {self.last_line}" if self.last_line else "nothing in its log yet" if self.own_log else ""
        said = ", ".join(p for p in (self.doing, log) if p)
        return f"{self.who}: {said or 'no log line yet'}"


Builds = Callable[[int, float | None], tuple[ChildProcess, ...]]
"""``rank_builds.builds_under``, or what a test stands in for it."""


def rank_activity(
    run: RunDirectory, model: RunModel, now: float | None = None, builds: Builds = builds_under
) -> tuple[RankActivity, ...]:
    """Each rank's phase (else its status, and what a starting rank builds) and last log line; a run of
    ``shardtop run`` has one log per host, its ranks' output together, whose last line stands for the
    host's ranks.  ``now``: the time, for how long a build has run."""
    now = time.time() if now is None else now
    local = {p.rank: p for p in model.meta.rank_pids} if model.meta.host == host_name() else {}
    out = []
    for r in model.ranks[:SHOWN_RANKS]:
        doing = r.state.phase or r.status.words
        process = local.get(r.rank)
        if r.status.state == "starting" and process is not None:
            building = build_words(builds(process.pid, process.started), now)
            doing += f", {building}" if building else ""
        log = run.rank_log(r.rank)
        tail = read_file_tail(log, 1)
        out.append(RankActivity(f"r{r.rank}", doing, tail[-1] if tail else "", log.is_file()))
    if not model.ranks:
        for path in sorted(run.logs_dir.glob("rank-*.log"))[:SHOWN_RANKS]:
            tail = read_file_tail(path, 1)
            out.append(RankActivity(path.stem.replace("rank-", "r"), "starting", tail[-1] if tail else "", True))
    for path in sorted(run.logs_dir.glob("command-*.log"))[:SHOWN_RANKS]:
        tail = read_file_tail(path, 1)
        if tail:
            out.append(RankActivity(path.stem.removeprefix("command-"), "", tail[-1]))
    return tuple(a for a in out if a.last_line or a.doing)
