"""Plans against every GPU recording in ``tests/fixtures/runs``: whatever recordings exist.

For each recorded run the plan is made from its ``run.json`` (the resolved
config: preset, sizes, devices, ``gpu_mem_limit``) for the GPU it ran on:

- a finished run: the planned peak is within 10 % of the allocator's
  measured peak (``Memory.peak``, the highest over the ranks);
- a run that ran out of memory: the plan says it does not fit;
- a run that neither finished nor failed (stopped from outside): the plan
  is not below what it had already used.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from shardtop.events import Memory, Oom, read_all
from shardtop.plan.cards import Gpu, card, limited
from shardtop.plan.presets import plan_config
from shardtop.runs import RunDirectory

RUNS = Path(__file__).resolve().parent / "fixtures" / "runs"
TOLERANCE = 0.10

KNOWN_MISSES = {
    "h200/20261129-152401-manual-placement-7ff5": (
        "cuDNN's convolution workspace is not planned: this run peaks at the end of backward, when the "
        "stem convolutions' backward runs with every first-half gradient alive and takes about 0.2 GB of "
        "workspace that only cuDNN's algorithm choice on the GPU decides (the plan is 15 % low)"
    ),
    "h200-split/20261201-045319-manual-placement-4ca9": (
        "the same run recorded with the memory split: at its peak (end of backward, step 2) the trace "
        "finds 292 MiB of temporaries ('other') beside parameters, gradients and optimizer state that "
        "match the plan, the cuDNN workspace above (the plan is 15 % low)"
    ),
}
"""Recordings the plan cannot meet today, and why."""


@dataclass(frozen=True)
class Recording:
    name: str
    config: dict[str, Any]
    peak: int
    oom: bool
    finished: bool
    gpu: Gpu


def _recording(path: Path) -> Recording | None:
    run = RunDirectory(path)
    config = run.read_meta()["config"]
    if config.get("accelerator") != "cuda":
        return None
    events, _ = read_all(run.events_dir)
    memory = [e for e in events if isinstance(e, Memory)]
    total = next((g.total for m in memory if m.gpus for g in m.gpus), None)
    limit = config.get("gpu_mem_limit")
    gpu = limited(int(limit)) if limit else card("recorded GPU", int(total or 0), "the recording")
    status = run.status()
    return Recording(
        name=f"{path.parent.name}/{path.name}",
        config=config,
        peak=max((m.peak or 0) for m in memory),
        oom=any(isinstance(e, Oom) for e in events),
        finished=status.exit is not None and status.exit.code == 0,
        gpu=gpu,
    )


def _recordings() -> list[Any]:
    found = [r for r in (_recording(p) for p in sorted(RUNS.glob("*/*/")) if (p / "run.json").is_file()) if r]
    return [
        pytest.param(r, id=r.name, marks=pytest.mark.xfail(strict=True, reason=KNOWN_MISSES[r.name]))
        if r.name in KNOWN_MISSES and r.finished else pytest.param(r, id=r.name)
        for r in found
    ]


@pytest.mark.parametrize("rec", _recordings())
def test_the_plan_of_a_recorded_gpu_run_agrees_with_it(rec: Recording) -> None:
    plan = plan_config(rec.config, devices=int(rec.config["devices"]), accelerator="cuda", gpu=rec.gpu)
    asked = plan.asked
    if rec.oom:
        assert asked.fits is False, f"{rec.name} ran out of memory; planned peak {asked.per_rank.peak}"
    elif rec.finished:
        error = (asked.per_rank.peak - rec.peak) / rec.peak
        assert abs(error) <= TOLERANCE, f"{rec.name}: planned {asked.per_rank.peak}, measured {rec.peak} ({error:+.1%})"
        assert asked.fits is True
    else:
        assert asked.per_rank.peak >= rec.peak, f"{rec.name} already used {rec.peak}; planned {asked.per_rank.peak}"


def test_there_are_gpu_recordings_of_each_outcome() -> None:
    found = [p.values[0] for p in _recordings()]
    assert any(r.oom for r in found) and any(r.finished for r in found)
