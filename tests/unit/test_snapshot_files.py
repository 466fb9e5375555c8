"""The allocator's snapshot as a file of the run: PyTorch's pickle, private, bounded, and said when cut; the
report names the files and how to open them, and says why a CPU run has none."""

from __future__ import annotations

import pickle
from pathlib import Path

from shardtop.probe.snapshots import write_snapshot
from shardtop.report import render_report
from shardtop.rundir.run_directory import RunDirectory
from tests.support.first_minutes import CPU_OOM, copy_first_minutes

SNAPSHOT = {
    "segments": [{"device": 0, "address": 4096, "total_size": 2 << 20, "allocated_size": 1 << 20, "blocks": []}],
    "device_traces": [[{"action": "alloc", "addr": 4096, "size": 1 << 20, "stream": 0, "frames": []}] * 500],
}
"""The shape of ``torch.cuda.memory._snapshot()``: segments, and one allocation trace per device."""


def test_a_snapshot_is_written_as_pytorch_pickles_it_and_kept_private(tmp_path: Path) -> None:
    event = write_snapshot(tmp_path, 3, "oom", SNAPSHOT)
    assert event is not None and (event.file, event.cut, event.entries) == ("snapshots/rank-3-oom.pickle", False, 500)
    path = tmp_path / event.file
    assert pickle.loads(path.read_bytes()) == SNAPSHOT and event.bytes == path.stat().st_size
    assert path.stat().st_mode & 0o077 == 0 and path.parent.stat().st_mode & 0o077 == 0


def test_a_snapshot_past_its_bound_leaves_its_trace_out_and_says_so(tmp_path: Path) -> None:
    whole = len(pickle.dumps(SNAPSHOT, protocol=pickle.HIGHEST_PROTOCOL))
    event = write_snapshot(tmp_path, 0, "peak", SNAPSHOT, max_bytes=whole - 1)
    assert event is not None and event.cut and event.entries == 0
    kept = pickle.loads((tmp_path / event.file).read_bytes())
    assert kept["segments"] == SNAPSHOT["segments"] and kept["device_traces"] == [[]]
    assert write_snapshot(tmp_path, 0, "peak", SNAPSHOT, max_bytes=10) is None  # the segments alone are too much


def test_the_report_of_a_cpu_oom_says_why_there_is_no_snapshot(tmp_path: Path) -> None:
    run = RunDirectory(copy_first_minutes(tmp_path / "runs", CPU_OOM))
    text = render_report(run, "text")
    assert "Memory snapshots" in text and "a CPU rank has no caching allocator to snapshot" in text
