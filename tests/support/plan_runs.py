"""Recorded runs with the plan their rank 0 writes at set-up, for the tests of predicted against measured.

The GPU recordings under ``tests/fixtures/runs/`` were made before runs
recorded their plan.  ``with_plan`` writes it into a copy, made by the
runner's own ``plan_event``, for the GPU the run recorded (its NVML samples):
exactly the event the run's rank 0 writes today on that machine.
"""

from __future__ import annotations

from pathlib import Path

from shardtop.plan.cards import card
from shardtop.rundir.event_files import EventWriter, event_file, read_all
from shardtop.rundir.events import Memory
from shardtop.rundir.run_directory import RunDirectory
from shardtop.runner.plan_at_setup import plan_event


def with_plan(run_dir: Path) -> RunDirectory:
    """``run_dir`` (a copy: it is written into) with the plan of its preset, as its rank 0 would write it."""
    run = RunDirectory(run_dir)
    config = run.read_meta().config
    events, _ = read_all(run.events_dir)
    gpu = next((g for e in events if isinstance(e, Memory) and e.gpus for g in e.gpus), None)
    recorded = card(gpu.name.removeprefix("NVIDIA ").strip(), gpu.total, "local GPU") if gpu is not None else None
    planned = plan_event(config, config.accelerator or "cpu", recorded)
    assert planned is not None
    writer = EventWriter(event_file(run.events_dir, 0), 0)
    writer.write(planned)
    writer.close()
    return run
