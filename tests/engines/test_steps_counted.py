"""Steps counted as the job takes them, on real CPU runs under ``shardtop run``: HF's Trainer under
DeepSpeed steps its optimizer twice a step (accelerate's wrapper, then the engine's), and that is one
step; a loop that accumulates gradients over micro-batches takes one step per optimizer step."""

from __future__ import annotations

from pathlib import Path

from tests.support.own_job_runs import ROOT, run_own

SCRIPTS = ROOT / "tests" / "own_scripts"


def steps_of(report: dict[str, object]) -> int:
    step = report["step"]
    assert isinstance(step, int)
    return step


def test_hf_trainer_under_deepspeed_counts_each_step_once(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    run = run_own(runs, "torchrun", "--standalone", "--nproc_per_node", "2", str(SCRIPTS / "hf_trainer.py"),
                  "--steps", "3", "--deepspeed", str(SCRIPTS / "ds_zero3.json"))
    assert run.code == 0, run.describe()
    report = run.report(runs)
    assert report["engine"] == "zero3"
    assert steps_of(report) == 3
    steps = [e for e in run.events() if e.rank == 0 and type(e).__name__ == "Step"]
    assert [e.step for e in steps] == [1, 2, 3]  # type: ignore[attr-defined]


def test_micro_batches_accumulated_into_one_optimizer_step_are_one_step(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    run = run_own(runs, "python", str(SCRIPTS / "accumulate.py"), "--steps", "3", "--micro", "2")
    assert run.code == 0, run.describe()
    assert steps_of(run.report(runs)) == 3


def fsdp2_train_rank_elements(rank: int, dim: int = 64, depth: int = 3) -> int:
    """Parameters ``fsdp2_train.py``'s model holds on ``rank`` of 2: every parameter split along its first
    dimension (each block's norm weight and bias, linear weight and bias; the head's ``[1, dim]`` weight and
    ``[1]`` bias go whole to rank 0)."""
    block = 3 * ((dim + 1) // 2) + ((dim + 1) // 2) * dim
    head = dim + 1 if rank == 0 else 0
    return depth * block + head


def test_optimizers_stepped_inside_backward_are_one_step_read_once_backward_ends(tmp_path: Path) -> None:
    """One AdamW per parameter, each stepped from its parameter's post-accumulate-grad hook: each backward
    is one step, and its snapshot is read once backward has ended, with every optimizer's state and FSDP2's
    units resharded (the root's is still gathered while the blocks' gradients arrive)."""
    runs = tmp_path / "runs"
    run = run_own(runs, "torchrun", "--standalone", "--nproc_per_node", "2", str(SCRIPTS / "fsdp2_train.py"),
                  "--steps", "3", "--optimizer-in-backward")
    assert run.code == 0, run.describe()
    report = run.report(runs)
    assert report["engine"] == "fsdp2"
    assert steps_of(report) == 3
    steps = [e for e in run.events() if e.rank == 0 and type(e).__name__ == "Step"]
    assert [e.step for e in steps] == [1, 2, 3]  # type: ignore[attr-defined]
    parameters, fp32, adam_step = 14, 4, 4
    for entry in report["ranks"]:
        held = fsdp2_train_rank_elements(entry["rank"]) * fp32
        assert entry["param_bytes"] == held, f"rank {entry['rank']}"
        assert entry["optim_bytes"] == 2 * held + parameters * adam_step, f"rank {entry['rank']}"
