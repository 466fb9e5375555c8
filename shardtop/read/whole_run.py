"""Read a run directory into its read model: the one place a whole run is read from disk.

``shardtop report``, ``shardtop runs`` and tests call ``read_run``; whatever
watches a run live reads it incrementally through ``follower.RunFollower``,
which builds the same ``RunModel``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path

from shardtop.read.run_fold import fold
from shardtop.read.run_model import RunModel
from shardtop.rundir.event_files import read_all
from shardtop.rundir.run_directory import RunDirectory

LOG_TAIL_LINES = 12
"""Lines of a rank's log kept to say why a run recorded nothing."""

LOG_TAIL_BYTES = 16 << 10


def read_file_tail(path: Path, lines: int = LOG_TAIL_LINES) -> tuple[str, ...]:
    """The last ``lines`` non-empty lines of a log file (a host's command log, a rank's); none if unreadable."""
    try:
        with open(path, "rb") as f:
            f.seek(0, 2)
            size = f.tell()
            f.seek(max(0, size - LOG_TAIL_BYTES))
            data = f.read()
    except OSError:
        return ()
    text = data.decode("utf-8", errors="replace").splitlines()
    return tuple(line for line in text if line.strip())[-lines:]


def log_tails(run: RunDirectory, ranks: Iterable[int]) -> Mapping[str, tuple[str, ...]]:
    """The tail of every log the run has, by its path in the run directory: each of ``ranks``' own (a preset's
    runs), each host's command's (``shardtop run``, a rehearsed command), the runner's.  Read only for
    runs that recorded no event."""
    paths = [run.rank_log(rank) for rank in ranks]
    paths += sorted(run.logs_dir.glob("command-*.log")) + [run.runner_log]
    tails = {str(path.relative_to(run.path)): read_file_tail(path) for path in paths}
    return {name: tail for name, tail in tails.items() if tail}


def read_run(run: RunDirectory) -> RunModel:
    """The whole run as it stands: events folded, ``run.json`` and the status read."""
    events, skipped = read_all(run.events_dir)
    state = fold(events, skipped)
    meta = run.read_meta()
    status = run.status()
    rehearsal = meta.config.rehearsal
    ranks = rehearsal.ranks if rehearsal is not None else range(max(meta.config.world_size, 1))
    tails = log_tails(run, ranks) if state.events == 0 else {}
    return RunModel.of(state, meta, status, tails)
