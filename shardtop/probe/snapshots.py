"""Memory snapshots per rank, in PyTorch's own format, for the tools people already open them with.

On CUDA the probe has the allocator's snapshot in hand twice: at an OOM, and when the steps it explains end
(their allocation trace, since set-up, holds the peak).  Each is written as PyTorch writes one
(``pickle`` of ``torch.cuda.memory._snapshot()``) to ``snapshots/rank-R-oom.pickle`` and
``rank-R-peak.pickle`` in the run directory, to open with ``python -m torch.cuda._memory_viz trace_plot
FILE -o FILE.html`` or at pytorch.org/memory_viz.  A file past ``MAX_BYTES`` leaves its allocation trace
out (the segments and blocks stay) and says so; one still past it is not written.  A ``Snapshot`` event
names each file.
"""

from __future__ import annotations

import os
import pickle
from pathlib import Path

from shardtop.probe.allocator import MemorySnapshot
from shardtop.rundir.events import Snapshot, SnapshotMoment

SNAPSHOT_DIR = "snapshots"
MAX_BYTES = 256 << 20
"""A snapshot file's bound: a trace of a long explained window over a large model can reach gigabytes."""


def entries_of(snapshot: MemorySnapshot) -> int:
    return sum(len(trace) for trace in snapshot.get("device_traces") or ())


def write_snapshot(run_dir: Path, rank: int, moment: SnapshotMoment, snapshot: MemorySnapshot,
                   max_bytes: int = MAX_BYTES) -> Snapshot | None:
    """Write ``snapshot`` for ``rank`` at ``moment``; the event naming it, or None where even without its
    trace it is past ``max_bytes``."""
    data = pickle.dumps(snapshot, protocol=pickle.HIGHEST_PROTOCOL)
    cut = False
    if len(data) > max_bytes and entries_of(snapshot):
        snapshot = {**snapshot, "device_traces": [[] for _ in snapshot.get("device_traces") or ()]}
        data = pickle.dumps(snapshot, protocol=pickle.HIGHEST_PROTOCOL)
        cut = True
    if len(data) > max_bytes:
        return None
    folder = run_dir / SNAPSHOT_DIR
    folder.mkdir(mode=0o700, exist_ok=True)
    name = f"rank-{rank}-{moment}.pickle"
    part = folder / f".{name}.{os.getpid()}"
    with open(os.open(part, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "wb") as f:
        f.write(data)
    os.replace(part, folder / name)  # whole or not at all
    return Snapshot(moment=moment, file=f"{SNAPSHOT_DIR}/{name}", bytes=len(data), cut=cut,
                    entries=entries_of(snapshot))
