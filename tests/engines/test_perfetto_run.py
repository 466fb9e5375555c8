"""A real CPU run (``fsdp2-mlp``, 2 gloo ranks, 3 steps) as a Perfetto trace, through the command a user types:
a file the trace event format's rules accept, each rank a named track with its three steps and their phases,
its memory by kind, and its exit."""

from __future__ import annotations

import json
from pathlib import Path

from shardtop.rundir.run_directory import list_runs
from tests.support.cli import report, shardtop
from tests.support.trace_event_format import problems


def test_a_real_cpu_run_opens_as_a_trace_of_its_ranks_phases_steps_and_memory(runs_dir: Path) -> None:
    done = shardtop("launch", "fsdp2-mlp", "--headless", "max_steps=3", runs_dir=runs_dir)
    assert done.returncode == 0, done.stdout + done.stderr
    [run] = list_runs(runs_dir)
    trace = json.loads(report(run.path, "perfetto"))
    assert problems(trace) == []
    ranks = json.loads(report(run.path, "json"))["ranks"]
    names = {e["args"]["name"]: e["pid"] for e in trace["traceEvents"] if e["name"] == "process_name"}
    assert set(names) == {f"rank {r['rank']} ({r['host']}, cpu)" for r in ranks} and len(names) == 2
    for pid in names.values():
        mine = [e for e in trace["traceEvents"] if e["pid"] == pid]
        threads = {e["args"]["name"]: e["tid"] for e in mine if e["name"] == "thread_name"}
        steps = [e["name"] for e in mine if e["ph"] == "X" and e["tid"] == threads["steps"]]
        assert steps == ["step 1", "step 2", "step 3"]
        phases = [e["name"] for e in mine if e["ph"] == "X" and e["tid"] == threads["phases"]]
        for phase in ("forward", "backward", "optimizer"):
            assert phases.count(phase) == 3, phases
        memory = [e["args"] for e in mine if e["ph"] == "C" and e["name"] == "memory"]
        assert memory and max(m["params"] for m in memory) > 0 and max(m["optimizer"] for m in memory) > 0
        assert [e["name"] for e in mine if e["ph"] == "i"] == ["exit: ok"]


def test_a_mistyped_format_names_the_formats(runs_dir: Path) -> None:
    done = shardtop("report", "--format", "perfeto", runs_dir=runs_dir)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert "invalid choice: 'perfeto'" in done.stderr and "'perfetto'" in done.stderr
