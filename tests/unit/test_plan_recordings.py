"""Plans against every GPU recording in ``tests/fixtures/runs``: whatever recordings exist.

For each recorded run the plan is made from its ``run.json`` (the resolved
config: preset, sizes, devices, ``gpu_mem_limit``) for the GPU it ran on:

- a finished run: the planned peak is within 3 % of the allocator's
  measured peak (``Memory.peak``, the highest over the ranks), except the
  ``KNOWN_MISSES``, each with its measured cause, which stay within 6 % and
  outside 3 % (so that a fix has to take it off the list);
- a run that ran out of memory: the plan runs out in the phase the run did,
  and plans there at least what the run had allocated and asked for (for the
  run ``FRAGMENTATION`` was set from, "runs out" is that allowance's verdict,
  and the test says so);
- a run that neither finished nor failed (stopped from outside): the plan
  is not below what it had already used.

FSDP1's flat shards are planned as the allocator counted them at set-up, to a kilobyte.

Where a run ran out at the last large request of its phase, the plan's
figure for that phase is within 10 % of what the allocator needed there;
and ZeRO-3 at 2000 layers on two ranks is set against the plan phase by
phase.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from shardtop.plan.cards import Gpu, card, limited
from shardtop.plan.memory import per_rank
from shardtop.plan.preset_strategies import PRESET_STRATEGIES
from shardtop.rundir.event_files import read_all
from shardtop.rundir.events import TIMELINE, Event, Memory, Oom, Phase
from shardtop.rundir.run_directory import RunDirectory
from shardtop.trace.presets import describe_preset, plan_config
from tests.support.allocator_shares import FRAGMENTATION_FITTED_ON

RUNS = Path(__file__).resolve().parents[1] / "fixtures" / "runs"
TOLERANCE = 0.10
"""A phase's figure against what the allocator needed there."""
PEAK_TOLERANCE = 0.03
"""A finished run's planned peak against the allocator's (docs/plan.md's "within 3 %"): the recordings
not in ``KNOWN_MISSES`` range from 1.9 % low to 2.8 % high."""
KNOWN_MISS_TOLERANCE = 0.06
"""What a known miss is still held to: today 3.9 % low (``ddp-baseline``, both recordings)."""

_FORWARD_END = (
    "peak in the second forward, planned 3.9 % low, by 162 to 163 MiB.  The allocator's trace at its peak (the "
    "requests alive, each of its own size) holds 752 MiB of activations with the batch against 730 MiB planned "
    "(the plan's saved tensors are, to the byte, what the same forward saves on CPU: "
    "tests/engines/test_plan_autocast.py; the 22 MiB are the GPU run's own, not identified) and 58 MiB beyond "
    "DDP's buckets and the workspaces, where the plan has 16 MiB (the transposed 16 x 16 convolution's output; "
    "that convolution's forward workspace is not measured).  The allocator's own peak is 97 to 99 MiB above the "
    "trace's: it counts each block whole, and a block is larger than its request where it was cut from a cached "
    "block with at most 1 MiB left over.  Which of the forward's blocks were so is not recorded; as the second "
    "forward began the allocator already counted 16 to 17 MiB beyond the tensors a census found and the "
    "workspaces")
KNOWN_MISSES: dict[str, str] = {
    "h200/20261204-012353-ddp-baseline-1350": _FORWARD_END,
    "h200-split/20261201-045257-ddp-baseline-f54a": _FORWARD_END,
}
"""Finished recordings the plan does not meet within ``PEAK_TOLERANCE``, and what their events show of why."""


LAST_REQUEST_OF_ITS_PHASE = {
    "h200-split/20261201-045047-zero3-linear-fixed-8617": (
        "one H200, 4000 layers: DeepSpeed's set-up asks for its gradient partitions last, after the reduce bucket "
        "was cut from the optimizer's freed gradient buffer"),
    "h200-rehearsal/20261201-211814-zero3-linear-fixed-f13b": (
        "rank 0 of two, 4000 layers: the first Adam step asks for sqrt(exp_avg_sq), its last temporary"),
}
"""Out-of-memory recordings whose failing request was the last large one of its phase, and what it was."""

ZERO3_TWO_RANKS_2000_LAYERS = "h200-rehearsal/20261204-005347-zero3-linear-fixed-410c"
FSDP1_FLAT_SHARDS = ("h200/20261204-012331-fsdp-auto-wrap-c2a4", "h200-rehearsal/20261201-212116-fsdp-auto-wrap-a415")
"""FSDP1 on the GPU, parameters on it: 28 units of 27.04 MiB, whole on one H200 and halved on each of two ranks."""


@dataclass(frozen=True)
class Recording:
    name: str
    config: dict[str, Any]
    peak: int
    oom: Oom | None
    finished: bool
    gpu: Gpu
    events: tuple[Event, ...]

    @property
    def oom_phase(self) -> str | None:
        """The phase of the plan's ``TIMELINE`` the run ran out in."""
        if self.oom is None:
            return None
        return _timeline_phase(self.oom.phase, self.oom.step)

    def needed_at_oom(self) -> int:
        """What the allocator needed when it failed: at set-up what it held (the plan counts set-up so),
        later what was allocated; and what it asked for."""
        o = self.oom
        assert o is not None and o.requested_bytes is not None
        held = o.reserved if self.oom_phase == "set-up" else o.allocated
        assert held is not None
        return held + o.requested_bytes


def _timeline_phase(phase: str, step: int) -> str:
    if phase in ("forward", "backward"):
        return phase if step <= 1 else f"next {phase}"
    return {"setup": "set-up", "optimizer": "optimizer step"}.get(phase, phase)


def _recording(path: Path) -> Recording | None:
    run = RunDirectory(path)
    config = run.read_meta().config.settings
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
        oom=next((e for e in events if isinstance(e, Oom)), None),
        finished=status.exit is not None and status.exit.code == 0,
        gpu=gpu,
        events=tuple(events),
    )


def _recordings() -> list[Any]:
    found = [r for r in (_recording(p) for p in sorted(RUNS.glob("*/*/")) if (p / "run.json").is_file()) if r]
    return [pytest.param(r, id=r.name) for r in found]


@pytest.mark.parametrize("rec", _recordings())
def test_the_plan_of_a_recorded_gpu_run_agrees_with_it(rec: Recording) -> None:
    plan = plan_config(rec.config, devices=int(rec.config["devices"]), accelerator="cuda", gpu=rec.gpu)
    asked = plan.asked
    if rec.name == FRAGMENTATION_FITTED_ON:
        # FRAGMENTATION was set from this run: the plan's need is under the cap and over the cap less the
        # allowance, so its "no fit" is the allowance's (tests/unit/test_fragmentation_allowance.py checks it
        # on the other recordings)
        assert rec.gpu.usable < asked.per_rank.peak < rec.gpu.total
    if rec.oom:
        assert asked.fits is False, f"{rec.name} ran out of memory; planned peak {asked.per_rank.peak}"
        assert asked.runs_out_at == rec.oom_phase, f"{rec.name} ran out at {rec.oom_phase}"
        planned = asked.per_rank.timeline[TIMELINE.index(rec.oom_phase)]
        assert rec.oom.allocated is not None and rec.oom.requested_bytes is not None
        least = rec.oom.allocated + rec.oom.requested_bytes
        assert planned >= least, f"{rec.name} needed at least {least} at {rec.oom_phase}; planned {planned}"
    elif rec.finished:
        error = (asked.per_rank.peak - rec.peak) / rec.peak
        measured = f"{rec.name}: planned {asked.per_rank.peak}, measured {rec.peak} ({error:+.1%})"
        if rec.name in KNOWN_MISSES:
            known = f"{measured}; known miss: {KNOWN_MISSES[rec.name]}"
            assert PEAK_TOLERANCE < abs(error) <= KNOWN_MISS_TOLERANCE, known
        else:
            assert abs(error) <= PEAK_TOLERANCE, measured
        assert asked.fits is True
    else:
        assert asked.per_rank.peak >= rec.peak, f"{rec.name} already used {rec.peak}; planned {asked.per_rank.peak}"


def test_there_are_gpu_recordings_of_each_outcome() -> None:
    found = [p.values[0] for p in _recordings()]
    assert any(r.oom for r in found) and any(r.finished for r in found)


def test_each_known_miss_is_a_finished_recording() -> None:
    finished = {r.name for r in (p.values[0] for p in _recordings()) if r.finished}
    assert set(KNOWN_MISSES) <= finished


def _named(name: str) -> Recording:
    rec = next((r for r in (p.values[0] for p in _recordings()) if r.name == name), None)
    assert rec is not None, f"recording {name} not found under {RUNS}"
    return rec


@pytest.mark.parametrize("name", sorted(LAST_REQUEST_OF_ITS_PHASE))
def test_a_run_that_ran_out_at_its_phases_last_request_is_planned_within_ten_percent_there(name: str) -> None:
    """The plan's figure for the phase against what the allocator needed when the run failed."""
    rec = _named(name)
    plan = plan_config(rec.config, devices=int(rec.config["devices"]), accelerator="cuda", gpu=rec.gpu)
    phase = plan.asked.runs_out_at
    assert phase is not None and phase == rec.oom_phase
    planned = plan.asked.per_rank.timeline[TIMELINE.index(phase)]
    error = (planned - rec.needed_at_oom()) / rec.needed_at_oom()
    assert abs(error) <= TOLERANCE, f"{name} at {phase}: planned {planned}, needed {rec.needed_at_oom()} ({error:+.1%})"


def _phase_peaks(events: tuple[Event, ...], rank: int) -> tuple[int, dict[str, tuple[int, bool]], int]:
    """One rank's set-up (the most the allocator held), per phase of ``TIMELINE`` after it (its first time:
    later steps repeat the second) the allocator's peak so far at the phase's end and whether it rose during
    the phase (then it is the phase's own peak), and the rank's peak over the run."""
    phase: str | None = "set-up"
    held = peak = 0
    peaks: dict[str, tuple[int, bool]] = {}
    for e in events:
        if e.rank != rank:
            continue
        if isinstance(e, Phase) and e.phase in ("forward", "backward", "optimizer"):
            named = _timeline_phase(e.phase, e.step)
            phase = None if named in peaks else named
        elif isinstance(e, Memory) and e.peak is not None:
            if phase == "set-up":
                held = max(held, e.reserved or 0)
            elif phase is not None:
                peaks[phase] = (max(peak, e.peak), e.peak > peak or peaks.get(phase, (0, False))[1])
            peak = max(peak, e.peak)
    return held, peaks, peak


@pytest.mark.parametrize("rank", [0, 1])
def test_zero3_at_2000_layers_on_two_ranks_is_planned_phase_by_phase(rank: int) -> None:
    """DeepSpeed's set-up, the first step (parameters gathered one module at a time), and the steps after
    it (prefetched and kept whole): each within 10 % of the rehearsal on one H200."""
    rec = _named(ZERO3_TWO_RANKS_2000_LAYERS)
    plan = plan_config(rec.config, devices=int(rec.config["devices"]), accelerator="cuda", gpu=rec.gpu)
    assert plan.asked.fits is True
    p = plan.asked.per_rank
    held, peaks, rank_peak = _phase_peaks(rec.events, rank)
    assert abs(p.setup - held) <= TOLERANCE * held, f"set-up: planned {p.setup}, the allocator held {held}"
    assert set(peaks) >= {"forward", "backward", "optimizer step", "next forward"}
    for phase, (measured, rose) in peaks.items():
        planned = p.timeline[TIMELINE.index(phase)]
        if rose:
            assert abs(planned - measured) <= TOLERANCE * measured, f"{phase}: planned {planned}, measured {measured}"
        else:
            assert planned <= (1 + TOLERANCE) * measured, f"{phase}: planned {planned}, never above {measured}"
    assert abs(p.peak - rank_peak) <= TOLERANCE * rank_peak, f"planned {p.peak}, measured {rank_peak}"


@pytest.mark.parametrize("name", FSDP1_FLAT_SHARDS)
def test_fsdp1s_flat_shards_are_planned_as_the_allocator_counted_them_at_set_up(name: str) -> None:
    """Once FSDP1 has flattened the units, what the allocator counts beyond the tensors a census finds (the
    engine's split: ``unexplained``) is each flat shard's segment left whole, as the plan has it (its set-up on
    the GPU less the same set-up without the allocator), to a kilobyte: 14 or 28 MiB, where the blocks were taken as
    their shards' sizes rounded up to 512 bytes."""
    rec = _named(name)
    config, devices = rec.config, int(rec.config["devices"])
    desc = describe_preset(config)
    strategy = PRESET_STRATEGIES[config["program"]](config, desc, "cuda", devices)
    planned = per_rank(desc, strategy, devices, gpu=True).setup - per_rank(desc, strategy, devices, gpu=False).setup
    splits = [e.split for e in rec.events
              if isinstance(e, Memory) and e.split is not None and e.split.phase == "engine"]
    assert splits, f"{name} has no split at the engine's set-up"
    for split in splits:
        assert split.unexplained is not None and abs(split.unexplained - planned) <= 1024, (split.unexplained, planned)
