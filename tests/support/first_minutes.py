"""The first launches of story 2 on a CPU machine, recorded (``tests/tui/fixtures/cpu-first-minutes/``), and
run directories made from them that a test can make grow: the head of a recording, live again."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

from shardtop.rundir.liveness import process_start_time

FIRST_MINUTES = Path(__file__).resolve().parent.parent / "tui" / "fixtures" / "cpu-first-minutes"
FIRST_LAUNCH = "20261206-144553-zero3-linear-0abd"
"""The first launch: DeepSpeed builds its CPU op for 38 s before the ranks say hello; two steps, torch's warnings."""
CPU_OOM = "20261206-154734-zero3-linear-718d"
"""Story 2 as the main job runs it on CPU (its 80 MiB cap kept by the allocator): both ranks out of memory
building the model, at ``net.73``."""
CPU_OOM_DATA_SEGMENT = "20261206-144755-zero3-linear-ef37"
"""Story 2 under a 150 MiB cap on the data segment (``RLIMIT_DATA``, the cap where the allocator's cannot be
built): both ranks out of memory in DeepSpeed's set-up, no module named."""
MIB = 1 << 20


def copy_first_minutes(dest: Path, name: str) -> Path:
    """A copy of one of the recordings under ``dest`` (a runs root)."""
    dest.mkdir(parents=True, exist_ok=True, mode=0o700)
    target = dest / name
    if not target.exists():
        shutil.copytree(FIRST_MINUTES / name, target)
    return target


def live_head(dest: Path, name: str, until: str, rank_pids: dict[int, int] | None = None) -> Path:
    """A copy of ``name`` cut before each rank's first ``until`` event (``hello``, ``oom``…), with no exit
    record, no log lines, and the calling process as the run's own: a run still under way.

    ``rank_pids``: the ranks' processes as the supervisor records them (rank -> pid).
    """
    run = copy_first_minutes(dest, name)
    (run / "exit.json").unlink(missing_ok=True)
    for log in (run / "logs").glob("*.log"):
        log.write_text("")
    for events in (run / "events").glob("rank-*.jsonl"):
        lines = events.read_text().splitlines(keepends=True)
        cut = next((i for i, line in enumerate(lines) if json.loads(line)["kind"] == until), len(lines))
        events.write_text("".join(lines[:cut]))
    meta = json.loads((run / "run.json").read_text())
    meta.update(pid=os.getpid(), pid_started=process_start_time(os.getpid()))
    meta["rank_pids"] = [
        {"rank": rank, "pid": pid, "started": process_start_time(pid)} for rank, pid in (rank_pids or {}).items()
    ]
    (run / "run.json").write_text(json.dumps(meta))
    return run


def append_memory(run: Path, rank: int, rss: int) -> None:
    """One more memory sample of ``rank``: its latest, with ``rss`` bytes resident."""
    events = run / "events" / f"rank-{rank}.jsonl"
    lines = events.read_text().splitlines()
    latest = json.loads(next(line for line in reversed(lines) if json.loads(line)["kind"] == "memory"))
    latest.update(host_rss=rss, t=latest["t"] + 0.5)
    with events.open("a") as f:
        f.write(json.dumps(latest) + "\n")
