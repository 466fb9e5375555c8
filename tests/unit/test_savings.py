"""A finding's saving is what the fix it names saves, computed from the finding's own evidence, or none.

Read as a user reads them: recorded runs (``tests/fixtures/runs``) diagnosed as ``shardtop report`` does,
and the rules' evidence where no recording has the case (a replicated optimizer, an offloaded one).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from shardtop.diagnose import diagnose
from shardtop.diagnose.finding import Finding
from shardtop.diagnose.memory import OptimizerHeavy, explain_optimizer_heavy
from shardtop.diagnose.placement import StrayContext, WrongGpu, explain_wrong_gpu
from shardtop.read.run_model import RunModel
from shardtop.read.whole_run import read_run
from shardtop.rundir.run_directory import RunDirectory
from shardtop.units import format_bytes

RUNS = Path(__file__).resolve().parents[1] / "fixtures" / "runs"
GiB = 1 << 30


def recorded(folder: str, name: str) -> RunModel:
    (path,) = [p for p in sorted((RUNS / folder).iterdir()) if p.is_dir() and p.name[16:-5] == name]
    return read_run(RunDirectory(path))


def finding(run: RunModel, code: str) -> Finding:
    found = [f for f in diagnose(run) if f.code == code]
    assert len(found) == 1, [f.code for f in diagnose(run)]
    return found[0]


@pytest.mark.parametrize("name", ["hf-trainer-zero3", "hf-trainer-fsdp", "lightning-bf16-true"])
def test_optimizer_state_on_a_gpu_offloaded_saves_all_of_it(name: str) -> None:
    """One H200 (``h200-clients``): the state leaves the GPU whole, so the saving is the rank's state."""
    run = recorded("h200-clients", name)
    f = finding(run, "optimizer-state-dominates")
    (rank,) = run.ranks
    assert rank.optim_bytes is not None and f.saving_bytes == rank.optim_bytes
    assert f.fix.startswith("Offload it to CPU") and f"its {format_bytes(rank.optim_bytes)} then leave the GPU" in f.fix


@pytest.mark.parametrize("name", ["zero3-linear", "zero3-linear-fixed"])
def test_optimizer_state_on_a_cpu_rank_offers_no_offload_and_no_saving(name: str) -> None:
    """Story 2 on six CPU processes (``cpu-6ranks``): ZeRO-3 shards the state already; a lighter optimizer's
    saving depends on the precision, so none is given."""
    f = finding(recorded("cpu-6ranks", name), "optimizer-state-dominates")
    assert f.saving_bytes is None
    assert "Offload it" not in f.fix and "nowhere to offload it to" in f.fix and "lighter optimizer" in f.fix


def _adam(engine: str, world: int, device: str, offloaded: bool = False) -> OptimizerHeavy:
    return OptimizerHeavy(engine=engine, world_size=world, data_parallel_size=world, rank=0, optimizer="AdamW",
                          optimizer_bytes=8 * GiB, param_bytes=4 * GiB, grad_bytes=4 * GiB, grads_recorded=True,
                          device=device, offloaded=offloaded)


def test_a_replicated_optimizer_sharded_over_n_ranks_saves_n_minus_1_nths() -> None:
    f = explain_optimizer_heavy(_adam("ddp", 4, "cuda:0"))
    assert f.saving_bytes == 6 * GiB and f.fix.startswith("Shard it across the 4 ranks")
    assert "1/4 of it, 6 GiB less" in f.fix


def test_an_optimizer_offloaded_already_is_not_offered_offload() -> None:
    f = explain_optimizer_heavy(_adam("zero3", 2, "cuda:0", offloaded=True))
    assert f.saving_bytes is None and "Offload it" not in f.fix and "offloaded to the CPU already" in f.fix


def test_a_cuda_context_on_another_gpu_has_no_saving_it_cannot_measure() -> None:
    """NVML's process list is recorded without each process's bytes there."""
    f = explain_wrong_gpu(WrongGpu((StrayContext(1, 4242, "node", "cuda:1", 0),), 2))
    assert f.saving_bytes is None and "MiB" not in f.detail and "GiB" not in f.detail


def test_story_2_built_whole_saves_n_minus_1_nths_of_the_model_and_on_one_gpu_says_it_needs_two() -> None:
    two = recorded("h200x2", "zero3-linear")
    f = finding(two, "zero3-not-partitioned-at-init")
    assert f.saving_bytes == two.full_bytes // 2 and format_bytes(f.saving_bytes) == "8.81 GiB"
    one = recorded("h200", "zero3-linear")
    f = finding(one, "zero3-not-partitioned-at-init")
    assert f.saving_bytes == one.full_bytes // 2
    assert f"On one GPU that alone cannot help (zero3-single-rank): on two, each GPU then holds half, " \
        f"{format_bytes(f.saving_bytes)} less." in f.fix


def test_one_rank_zero3_saves_what_two_gpus_would_and_says_so() -> None:
    run = recorded("h200-clients", "hf-trainer-zero3")
    f = finding(run, "zero3-single-rank")
    (rank,) = run.ranks
    assert f.saving_bytes == rank.param_bytes // 2 > 0
    assert f"on two GPUs {format_bytes(f.saving_bytes)} less" in f.fix


def test_the_main_job_on_cpu_saves_half_the_model_per_rank() -> None:
    """The README's main job on two CPU processes (``tests/tui/fixtures/cpu-first-minutes``): 96.2 MiB built
    whole on each rank; under ``zero.Init`` each of the two would hold half."""
    path = RUNS.parent.parent / "tui" / "fixtures" / "cpu-first-minutes" / "20261206-154734-zero3-linear-718d"
    run = read_run(RunDirectory(path))
    f = finding(run, "zero3-not-partitioned-at-init")
    assert run.world_size == 2 and f.saving_bytes == run.full_bytes // 2
    assert (format_bytes(run.full_bytes), format_bytes(f.saving_bytes)) == ("96.2 MiB", "48.1 MiB")
