"""The diagnosis of a rehearsal: what the rehearsed ranks hold is still found, and nothing is claimed
that needs ranks that were not run, or ranks alive together.

Real rehearsals (``tests/fixtures/runs/cpu-rehearsal``: ranks 0 and 3 of 4, one CPU process after
the other) are read as a user reads them; each rule that would say too much is shown on one, and
on the close case that is no rehearsal (the same events read as a real run), where it speaks.
Evidence only a GPU has (allocator samples, NVML's process lists) is on event streams shaped like
a GPU rehearsal's, as the probe writes them: each rank alone on ``cuda:0``, one after the other.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import msgspec
import pytest

from shardtop.diagnose import diagnose
from shardtop.read.run_fold import fold
from shardtop.read.run_model import RunModel
from shardtop.read.whole_run import read_run
from shardtop.rundir.events import Event, Exit, Hello, Memory, Phase, Shards, Tree
from shardtop.rundir.memory_figures import GpuMemory
from shardtop.rundir.run_config import RehearsalConfig, RunConfig
from shardtop.rundir.run_directory import RunDirectory
from shardtop.rundir.run_meta import RunMeta
from tests.support.recorded import copy_runs, live_copy

GiB = 1 << 30
MiB = 1 << 20

FSDP2 = "cpu-rehearsal/fsdp2-mlp"
ZERO3 = "cpu-rehearsal/zero3-linear"
"""Story 2 as asked (96 layers on CPU), ranks 0 and 3 of 4: each built the whole model first."""


def codes(model: RunModel) -> list[str]:
    return [f.code for f in diagnose(model)]


def as_real_run(run: Path) -> Path:
    """The same run directory without its rehearsal: read as a job whose ranks ran together."""
    meta = json.loads((run / "run.json").read_text())
    del meta["config"]["rehearsal"]
    (run / "run.json").write_text(json.dumps(meta))
    return run


@pytest.fixture
def runs(tmp_path: Path) -> dict[str, Path]:
    return copy_runs(tmp_path / "runs", FSDP2, ZERO3, "cpu-6ranks/zero3-linear", "cpu/fsdp2-mlp")


def test_each_rehearsal_shows_what_its_ranks_hold(runs: dict[str, Path]) -> None:
    assert codes(read_run(RunDirectory(runs[FSDP2]))) == ["optimizer-state-dominates"]
    assert codes(read_run(RunDirectory(runs[ZERO3]))) == ["zero3-not-partitioned-at-init", "optimizer-state-dominates"]


def test_zero3_built_whole_says_which_ranks_were_rehearsed(runs: dict[str, Path]) -> None:
    model = read_run(RunDirectory(runs[ZERO3]))
    built = diagnose(model)[0]
    assert built.evidence.whole_ranks == 2 and built.evidence.rehearsed == 2  # type: ignore[attr-defined]
    assert "each of the 2 rehearsed ranks (of 4) held the whole model" in built.detail
    assert built.saving_bytes == model.full_bytes * 3 // 4 and "1/4 of it" in built.detail
    real = diagnose(read_run(RunDirectory(runs["cpu-6ranks/zero3-linear"])))[0]
    assert real.code == built.code and "6 of 6 ranks held the whole model" in real.detail


def _small_host(run: Path, memory: int) -> Path:
    """The recorded rehearsal as if its host had ``memory`` bytes: each rank's hello says so."""
    for path in (run / "events").glob("rank-*.jsonl"):
        lines = []
        for line in path.read_text().splitlines():
            event = json.loads(line)
            if event["kind"] == "hello":
                event["host_memory"] = memory
            lines.append(json.dumps(event))
        path.write_text("\n".join(lines) + "\n")
    return run


def test_whole_copies_in_host_memory_are_not_summed_over_ranks_that_ran_one_at_a_time(
    runs: dict[str, Path],
) -> None:
    """Two whole copies (2 × 96 MiB) against a 256 MiB host: they never shared it in a rehearsal."""
    run = _small_host(runs[ZERO3], 256 * MiB)
    assert "host-memory-whole-model-per-rank" not in codes(read_run(RunDirectory(run)))
    assert "zero3-not-partitioned-at-init" in codes(read_run(RunDirectory(run)))  # what each rank built stays
    real = diagnose(read_run(RunDirectory(as_real_run(run))))
    (host,) = [f for f in real if f.code == "host-memory-whole-model-per-rank"]
    assert host.title.startswith("Every rank on vm loads the whole model into host memory: 2 × 96.2 MiB")


def test_nothing_recorded_speaks_of_the_rehearsed_ranks(runs: dict[str, Path], tmp_path: Path) -> None:
    for run in (runs[FSDP2], runs["cpu/fsdp2-mlp"]):
        shutil.rmtree(run / "events")
        (run / "events").mkdir()
    (rehearsed,) = diagnose(read_run(RunDirectory(runs[FSDP2])))
    assert rehearsed.code == "nothing-recorded"
    assert "none of the rehearsed ranks 0, 3 of 4 wrote an event" in rehearsed.detail
    (real,) = diagnose(read_run(RunDirectory(runs["cpu/fsdp2-mlp"])))
    assert real.code == "nothing-recorded" and "none of its ranks wrote an event" in real.detail


def test_a_rank_that_waits_is_not_stalled_behind_ranks_that_ran_before_it(tmp_path: Path) -> None:
    """The rehearsal live again, rank 3 (the second rehearsed) still in step 2's forward five minutes on
    while its sampler writes; rank 0 ended before it started. A real run would read rank 3 as stalled
    behind rank 0; a rehearsal's ranks run one after another, and its collectives wait for no one."""
    run = live_copy(tmp_path / "runs", ZERO3)
    path = run / "events" / "rank-3.jsonl"
    events = [json.loads(line) for line in path.read_text().splitlines()]
    cut = next(i for i, e in enumerate(events) if e["kind"] == "phase" and (e["phase"], e["step"]) == ("forward", 2))
    kept = events[: cut + 1]
    sample = next(e for e in reversed(kept) if e["kind"] == "memory")
    kept.append({**sample, "t": kept[-1]["t"] + 300.0})
    path.write_text("".join(json.dumps(e) + "\n" for e in kept))
    model = read_run(RunDirectory(run))
    assert model.rank(3) is not None and model.rank(3).status.state == "running"  # type: ignore[union-attr]
    assert not model.stalls and "rank-stalled" not in codes(model)
    real = read_run(RunDirectory(as_real_run(run)))
    assert set(real.stalls) == {3} and "rank-stalled" in codes(real)


# -- GPU evidence, on event streams shaped like a GPU rehearsal's -------------------------------------

PIDS = (4_194_401, 4_194_402)
_clock = [1_800_000_000.0]


def _stamp(event: Event, rank: int) -> Event:
    _clock[0] += 0.1
    return msgspec.structs.replace(event, rank=rank, host="gpu-box", t=_clock[0])


def rehearsed(events: list[Event], ranks: tuple[int, ...], world: int, real: bool = False) -> RunModel:
    """The events read as a rehearsal of ``ranks`` of ``world`` on one H200 (``real``: as a real run)."""
    rehearsal = None if real else RehearsalConfig(world_size=world, ranks=ranks, on="1 × NVIDIA H200")
    return RunModel.of(fold(events), RunMeta(config=RunConfig(world_size=world, rehearsal=rehearsal)))


def one_after_another(peaks: tuple[int, int], gpus: tuple[GpuMemory, ...] = ()) -> list[Event]:
    """Ranks 0 and 1 of 2, each alone on cuda:0: rank 1 starts once rank 0 has left."""
    events: list[Event] = []
    for rank, peak in enumerate(peaks):
        events.append(_stamp(Hello(pid=PIDS[rank], world_size=2, device="cuda:0", engine="ddp"), rank))
        events.append(_stamp(Phase(phase="backward", step=2), rank))
        seen = tuple(msgspec.structs.replace(g, pids=[PIDS[rank]]) for g in gpus)
        events.append(_stamp(Memory(device="cuda:0", allocated=peak // 2, peak=peak, gpus=list(seen) or None), rank))
        events.append(_stamp(Exit(code=0, status="ok"), rank))
    return events


def test_allocator_peaks_of_ranks_that_ran_at_different_times_are_not_compared() -> None:
    events = one_after_another((30 * GiB, 6 * GiB))
    run = rehearsed(events, (0, 1), 2)
    assert run.comparable_memory is None and "placement-imbalance" not in codes(run)
    real = rehearsed(events, (0, 1), 2, real=True)
    assert real.comparable_memory is not None
    (f,) = [f for f in diagnose(real) if f.code == "placement-imbalance"]
    assert f.evidence.main.kind == "allocator"  # type: ignore[attr-defined]


def test_no_gpu_or_process_list_is_read_as_the_jobs() -> None:
    """Rank 0 of 2 rehearsed on the machine's GPU 3 (CUDA_VISIBLE_DEVICES=3): its cuda:0 is NVML's GPU 3,
    and GPU 0 is another user's. A real run would be told a stray CUDA context and uneven GPUs."""
    gpus = [
        GpuMemory(index=0, used=40 * GiB, total=140 * GiB, pids=[4_194_431]),
        GpuMemory(index=3, used=12 * GiB, total=140 * GiB, pids=[PIDS[0]]),
    ]
    events: list[Event] = [
        _stamp(Hello(pid=PIDS[0], world_size=2, device="cuda:0", engine="ddp"), 0),
        _stamp(Phase(phase="forward", step=1), 0),
        _stamp(Memory(device="cuda:0", allocated=10 * GiB, reserved=11 * GiB, peak=10 * GiB, gpus=gpus), 0),
    ]
    run = rehearsed(events, (0,), 2)
    assert run.comparable_gpus("gpu-box") is None
    assert not {"cuda-context-on-wrong-gpu", "placement-imbalance"} & set(codes(run))
    real = codes(rehearsed(events, (0,), 2, real=True))
    assert {"cuda-context-on-wrong-gpu", "placement-imbalance"} <= set(real)


def test_memory_outside_pytorch_is_not_put_down_to_nccl_in_a_rehearsal() -> None:
    gpus = (GpuMemory(index=0, used=9 * GiB, total=140 * GiB),)
    events = one_after_another((2 * GiB, 2 * GiB), gpus)
    events = [msgspec.structs.replace(e, reserved=3 * GiB) if isinstance(e, Memory) else e for e in events]
    (f,) = [f for f in diagnose(rehearsed(events, (0, 1), 2)) if f.code == "memory-outside-pytorch"]
    assert "no NCCL communicator was made" in f.detail and "NCCL_BUFFSIZE" not in f.fix
    (real,) = [f for f in diagnose(rehearsed(events, (0, 1), 2, real=True)) if f.code == "memory-outside-pytorch"]
    assert "NCCL_BUFFSIZE" in real.fix and "communicator" not in real.detail


# -- what a rehearsed rank holds is still compared across the ranks rehearsed -----------------------


def test_parameter_bytes_of_the_rehearsed_ranks_are_compared() -> None:
    """Ranks 0 and 3 of 4: rank 0 keeps a whole layer the others shard (what ``rank=0,last`` is for)."""
    tree = Tree(tree_id=0, names=["", "a", "b"], parents=[-1, 0, 0], types=[0, 1, 1], type_names=["Net", "Linear"],
                params=[0, 100 * MiB, 100 * MiB], bytes=[0, 400 * MiB, 400 * MiB])
    events: list[Event] = [_stamp(tree, 0)]
    for rank, held in ((0, (0, 400 * MiB, 100 * MiB)), (3, (0, 100 * MiB, 100 * MiB))):
        events.append(_stamp(Hello(pid=PIDS[0], world_size=4, device="cuda:0", engine="fsdp2"), rank))
        events.append(_stamp(Shards(tree_id=0, engine="fsdp2", stage="engine", devices=["cuda:0"],
                                    states=["sharded"], bytes=list(held), device=[-1, 0, 0], state=[-1, 0, 0],
                                    unit=[-1, -1, -1], units=[]), rank))
    (f,) = [f for f in diagnose(rehearsed(events, (0, 3), 4)) if f.code == "placement-imbalance"]
    main = f.evidence.main  # type: ignore[attr-defined]
    assert (main.kind, main.heavy, main.light) == ("ranks", "rank 0", "rank 3") and f.modules == ("a",)
    # the same two ranks of a real 4-rank job: two ranks never reported, so nothing is compared
    assert "placement-imbalance" not in codes(rehearsed(events, (0, 3), 4, real=True))
