"""Hugging Face clients rehearsed unchanged: the ``Trainer`` and an ``accelerate`` loop, read as a user reads them.

The scripts (``tests/own_scripts/hf_trainer.py``, ``accelerate_train.py``,
their tiny Llama in ``hf_tiny.py``) import nothing of shardtop.  What a user
checks is ``shardtop report RUN --format json``: the engine, each rank's share
of every module, its gradient and optimizer bytes, that the run finished; and
in the command's own output, that every rehearsed rank trained on finite
values and read its own part of the data.

- ``shardtop rehearse devices=8 rank=0,last`` of ``python hf_trainer.py
  --deepspeed ds_zero3.json`` (the Trainer reads the rehearsal's environment,
  no launcher), ``torchrun … hf_trainer.py --stream`` (DDP, a streamed
  dataset), ``accelerate launch`` with the DeepSpeed plugin and LoRA, and with
  the FSDP plugin (which accelerate runs as DDP on CPU: its FSDP needs an
  accelerator device).  No dimension of the model divides by 8: rank 7's
  share is smaller than rank 0's.
- ``accelerate launch --num_processes 2`` with the DeepSpeed plugin, rehearsed
  (ranks 0 and 1 of 2) and run for real under ``shardtop run`` (two gloo
  processes): every figure equal, rank by rank, and each rank read the same
  first batch.
- accelerate's FSDP2 loading of a full state dict (``cpu_ram_efficient_loading``),
  which only runs on GPUs through accelerate: its own function, called on FSDP2
  on CPU as rank 3 of 4, deals each rank its own rows.

The runs start together, three at a time, and each test waits for its own:
about 2 minutes on 2 cores.
"""

from __future__ import annotations

import importlib.util
import json
import re
import subprocess
import sys
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from shardtop.rundir.run_directory import list_runs
from tests.support.cli import ROOT, shardtop
from tests.support.distributed import free_port
from tests.support.own_job_runs import GLOO_TEARDOWN_ABORT, user_env
from tests.support.shares import zero3_share

CLIENTS = ("transformers", "accelerate", "peft", "deepspeed")
"""What the scripts run on: all in the ``test`` extra."""
TRAINER = "tests/own_scripts/hf_trainer.py"
LOOP = "tests/own_scripts/accelerate_train.py"
ZERO3_CONFIG = "tests/own_scripts/ds_zero3.json"
ACCELERATE_ZERO3 = "tests/own_scripts/accelerate_zero3.yaml"
ACCELERATE_FSDP2 = "tests/own_scripts/accelerate_fsdp2.yaml"
HIDDEN = 30
"""The tiny Llama's hidden size: ZeRO-3's ``"auto"`` persistence threshold is ten times it."""
PERSISTENCE = 10 * HIDDEN
STEPS = 3
AT_THE_SAME_TIME = 3
RUN_TIMEOUT = 300


def accelerate(config: str, processes: int, *script_args: str) -> tuple[str, ...]:
    """``accelerate launch`` of the loop; on a port of its own (accelerate's default, 29500, may be another job's)."""
    return ("accelerate", "launch", "--config_file", config, "--num_processes", str(processes),
            "--main_process_port", str(free_port()), LOOP, *script_args)


@dataclass(frozen=True)
class Job:
    """A command run as a user types it: rehearsed (``ranks`` of a job of ``world``) or for real."""

    command: tuple[str, ...]
    world: int
    ranks: str | None = None
    """``rank=`` of the rehearsal; None for a real run under ``shardtop run``."""

    def arguments(self) -> list[str]:
        if self.ranks is None:
            return ["run", "--headless", "--", *self.command]
        return ["rehearse", f"devices={self.world}", f"rank={self.ranks}", "--headless", "--", *self.command]

    def __str__(self) -> str:
        how = f"rehearsal (rank {self.ranks} of {self.world})" if self.ranks else "real run"
        return f"{how} of {' '.join(self.command)}"


TRAINER_ZERO3 = Job(("python", TRAINER, "--deepspeed", ZERO3_CONFIG), 8, "0,last")
TRAINER_STREAMED = Job(("torchrun", "--nproc_per_node", "8", TRAINER, "--stream"), 8, "0,last")
LOOP_ZERO3_LORA = Job(accelerate(ACCELERATE_ZERO3, 8, "--lora", "--stream"), 8, "0,last")
LOOP_FSDP2 = Job(accelerate(ACCELERATE_FSDP2, 8), 8, "last")
LOOP_ZERO3_REAL = Job(accelerate(ACCELERATE_ZERO3, 2, "--stream"), 2)
LOOP_ZERO3_REHEARSED = Job(accelerate(ACCELERATE_ZERO3, 2, "--stream"), 2, "0,1")


@dataclass(frozen=True)
class Ran:
    """A job's exit code, its report as ``shardtop report RUN --format json`` gives it, and the command's output."""

    code: int
    report: dict[str, Any]
    log: str


def run_and_report(job: Job, runs_dir: Path) -> Ran:
    done = shardtop(*job.arguments(), runs_dir=runs_dir, timeout=RUN_TIMEOUT, env=user_env())
    runs = list_runs(runs_dir)
    assert len(runs) == 1, f"{job}: {len(runs)} runs\n{done.stdout[-3000:]}{done.stderr[-3000:]}"
    log = "\n".join(p.read_text(errors="replace") for p in sorted(runs[0].logs_dir.glob("command-*.log")))
    # Two real gloo processes abort at interpreter exit now and then (``GLOO_TEARDOWN_ABORT``), once the script
    # has said how it trained: not what these tests are about.  An abort before that is a failed run.
    torn_down = job.ranks is None and GLOO_TEARDOWN_ABORT in log and "trained as " in log
    assert done.returncode == 0 or torn_down, (
        f"{job}: exit {done.returncode}\n{done.stdout[-3000:]}{done.stderr[-3000:]}\n--- command ---\n{log[-6000:]}"
    )
    report = shardtop("report", str(runs[0].path), "--format", "json", runs_dir=runs_dir, env=user_env())
    assert report.returncode == 0, report.stderr[-3000:]
    return Ran(done.returncode, json.loads(report.stdout), log)


class Runs:
    """The runs the selected tests need, started together, a few at a time; a test waits for its own."""

    def __init__(self, jobs: list[Job], root: Path) -> None:
        self._pool = ThreadPoolExecutor(max_workers=AT_THE_SAME_TIME)
        self._ran: dict[Job, Future[Ran]] = {
            job: self._pool.submit(run_and_report, job, root / f"runs-{i}") for i, job in enumerate(jobs)
        }

    def get(self, job: Job) -> Ran:
        return self._ran[job].result()

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)


@pytest.fixture(scope="module")
def runs(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Runs]:
    wanted: dict[Job, None] = {}
    for item in request.session.items:
        if isinstance(item, pytest.Function):
            wanted.update(dict.fromkeys(JOBS_OF_TEST.get(item.function, ())))
    started = Runs(list(wanted), tmp_path_factory.mktemp("rehearse-clients"))
    yield started
    started.close()


# -- what a user reads --------------------------------------------------------------------------


def holdings(report: dict[str, Any]) -> dict[str, dict[int, dict[str, Any]]]:
    """Per module with parameters of its own, per rank: its bytes, device, state, gradient and optimizer bytes."""
    return {
        m["path"]: {h["rank"]: {k: v for k, v in h.items() if k not in ("rank", "act_bytes")} for h in m["ranks"]}
        for m in report["modules"]
        if m["params"]
    }


def rank_totals(report: dict[str, Any]) -> dict[int, tuple[str, int, int, int]]:
    return {r["rank"]: (r["snapshot"], r["param_bytes"], r["grad_bytes"], r["optim_bytes"]) for r in report["ranks"]}


def logged_losses(log: str) -> list[tuple[float, float]]:
    """The Trainer's logged (loss, grad_norm) pairs, in order."""
    return [(float(loss), float(norm)) for loss, norm in re.findall(r"'loss': '([^']+)', 'grad_norm': '([^']+)'", log)]


def first_batches(log: str) -> dict[int, int]:
    """``accelerate_train.py``'s line per rank: the sum of the tokens of its first batch.  Two ranks print theirs at
    the same moment, unbuffered (the text and its newline in two writes), so one may run into the other's."""
    return {int(r): int(s) for r, s in re.findall(r"rank (\d+) reads tokens summing to (\d+) first", log)}


def assert_finished(ran: Ran, engine: str, world: int, ranks: list[int]) -> None:
    report = ran.report
    assert (report["run"]["status"], report["run"]["exit_code"]) == ("finished", 0), report["run"]
    assert (report["engine"], report["world_size"]) == (engine, world)
    assert [r["rank"] for r in report["ranks"]] == ranks
    assert {r["engine"] for r in report["ranks"]} == {engine}
    assert {r["snapshot"] for r in report["ranks"]} == {"step"}  # read again after a step, with the optimizer
    assert {(r["exit"]["code"], r["status"]) for r in report["ranks"]} == {(0, "finished")}
    assert report["step"] == STEPS


def assert_zero3_shares(report: dict[str, Any], trained: Callable[[str], bool]) -> None:
    """Every module as ZeRO-3 deals it to each rehearsed rank: partitioned, and below the persistence
    threshold also whole; gradients partitioned, AdamW's fp32 master and moments (3 × 4 bytes an element) for the
    ``trained`` modules only."""
    world = report["world_size"]
    assert report["info"]["persistence_threshold"] == PERSISTENCE  # HF's "auto", filled from the model
    assert report["info"]["zero_init"] is True  # built under deepspeed.zero.Init, as from_pretrained builds it
    sizes = {m["path"]: (m["params"], m["bytes"]) for m in report["modules"] if m["params"]}
    totals = rank_totals(report)
    for path, ranks in holdings(report).items():
        numel, full = sizes[path]
        itemsize = full // numel
        for rank, held in ranks.items():
            share = zero3_share(numel, world, rank) * itemsize
            persistent = numel <= PERSISTENCE
            assert held["state"] == ("persistent" if persistent else "sharded"), (path, rank, held)
            # a persistent parameter is held whole beside its partition once a forward gathered it
            assert held["bytes"] == share + (full if persistent else 0), (path, rank, held)
            assert held["device"] == "cpu"
            assert held["grad_bytes"] == (share if trained(path) else 0), (path, rank, held)
            assert held["optim_bytes"] == (3 * share if trained(path) else 0), (path, rank, held)
    for rank in totals:
        assert totals[rank][1] == sum(h[rank]["bytes"] for h in holdings(report).values())
    first, last = min(totals), max(totals)
    assert world == 2 or totals[last][1] < totals[first][1]  # the last rank's partitions are the short ones


def test_the_clients_these_jobs_run_are_installed() -> None:
    """The ``test`` extra brings them: a missing one fails here by name, not as a failed run."""
    assert [name for name in CLIENTS if importlib.util.find_spec(name) is None] == []


# -- the Trainer ----------------------------------------------------------------------------------


def test_trainer_under_zero3_reads_the_rehearsals_environment(runs: Runs) -> None:
    ran = runs.get(TRAINER_ZERO3)
    assert_finished(ran, "zero3", 8, [0, 7])
    assert ran.report["strategy"] == "deepspeed_stage_3"
    assert_zero3_shares(ran.report, trained=lambda path: True)
    for rank in (0, 7):  # no launcher: the Trainer took its rank and world from the rehearsal's environment
        assert f"trained as DistributedType.DEEPSPEED (DeepSpeedEngine), rank {rank} of 8" in ran.log, ran.log[-3000:]
    # Rank 7 trained on initialised weights: transformers fills them on rank 0 only and broadcasts them.
    losses = logged_losses(ran.log)
    assert len(losses) == 2 * STEPS, ran.log[-3000:]
    assert all(1 < loss < 10 and 0 < norm < 10 for loss, norm in losses), losses


def test_trainer_under_torchrun_with_a_streamed_dataset(runs: Runs) -> None:
    ran = runs.get(TRAINER_STREAMED)
    assert_finished(ran, "ddp", 8, [0, 7])
    sizes = {m["path"]: m["bytes"] for m in ran.report["modules"] if m["params"]}
    for path, ranks in holdings(ran.report).items():
        assert {(h["state"], h["bytes"], h["grad_bytes"]) for h in ranks.values()} == {
            ("replicated", sizes[path], sizes[path])
        }, path
    model = sum(sizes.values())
    for _snapshot, params, grads, optim in rank_totals(ran.report).values():
        assert (params, grads) == (model, model) and optim >= 2 * model  # AdamW's two moments
    for rank in (0, 7):
        assert f"trained as DistributedType.MULTI_CPU (DistributedDataParallel), rank {rank} of 8" in ran.log
    # accelerate reads a stream on rank 0 and sends each rank its slice: rank 7 read its own, not rank 0's.
    losses = logged_losses(ran.log)
    assert len(losses) == 2 * STEPS and all(1 < loss < 10 for loss, _ in losses), ran.log[-3000:]
    assert losses[:STEPS] != losses[STEPS:]


# -- accelerate ---------------------------------------------------------------------------------


def test_accelerate_zero3_plugin_trains_lora_adapters(runs: Runs) -> None:
    ran = runs.get(LOOP_ZERO3_LORA)
    assert_finished(ran, "zero3", 8, [0, 7])
    assert "engine-not-as-asked" not in {f["code"] for f in ran.report["findings"]}  # ZeRO-3 asked, ZeRO-3 run
    adapters = [p for p in holdings(ran.report) if ".lora_A." in p or ".lora_B." in p]
    assert len(adapters) == 2 * 2 * 2  # q_proj and v_proj of two layers, A and B each
    assert_zero3_shares(ran.report, trained=lambda path: path in adapters)
    assert "trained as DistributedType.DEEPSPEED (DeepSpeedEngine), 8 processes" in ran.log
    assert sorted(first_batches(ran.log)) == [0, 7] and len(set(first_batches(ran.log).values())) == 2


def test_accelerate_fsdp_plugin_on_cpu_trains_with_ddp(runs: Runs) -> None:
    ran = runs.get(LOOP_FSDP2)
    assert_finished(ran, "ddp", 8, [7])
    assert "trained as DistributedType.MULTI_CPU (DistributedDataParallel), 8 processes" in ran.log
    sizes = {m["path"]: m["bytes"] for m in ran.report["modules"] if m["params"]}
    assert {p: h[7]["bytes"] for p, h in holdings(ran.report).items()} == sizes
    # The config asked for FSDP2: the report says what it got instead, and why on CPU.
    (asked,) = [f for f in ran.report["findings"] if f["code"] == "engine-not-as-asked"]
    assert (asked["evidence"]["asked"], asked["evidence"]["engine"]) == ("fsdp2", "ddp")
    assert "FSDP only on accelerator devices" in asked["fix"]


def test_rehearsed_accelerate_ranks_hold_and_read_what_the_real_ranks_do(runs: Runs) -> None:
    rehearsed, real = runs.get(LOOP_ZERO3_REHEARSED), runs.get(LOOP_ZERO3_REAL)
    assert_finished(rehearsed, "zero3", 2, [0, 1])
    assert (real.report["engine"], real.report["world_size"]) == ("zero3", 2)
    assert [m["path"] for m in rehearsed.report["modules"]] == [m["path"] for m in real.report["modules"]]
    assert holdings(rehearsed.report) == holdings(real.report)
    assert rank_totals(rehearsed.report) == rank_totals(real.report)
    assert_zero3_shares(rehearsed.report, trained=lambda path: True)
    # The streamed batches: rehearsed rank 1 read the very batch the real rank 1 was sent by rank 0.
    assert sorted(first_batches(real.log)) == [0, 1], (real.code, real.report["run"], real.log[-3000:])
    assert first_batches(rehearsed.log) == first_batches(real.log)
    assert len(set(first_batches(real.log).values())) == 2


JOBS_OF_TEST: dict[Callable[..., None], tuple[Job, ...]] = {
    test_trainer_under_zero3_reads_the_rehearsals_environment: (TRAINER_ZERO3,),
    test_trainer_under_torchrun_with_a_streamed_dataset: (TRAINER_STREAMED,),
    test_accelerate_zero3_plugin_trains_lora_adapters: (LOOP_ZERO3_LORA,),
    test_accelerate_fsdp_plugin_on_cpu_trains_with_ddp: (LOOP_FSDP2,),
    test_rehearsed_accelerate_ranks_hold_and_read_what_the_real_ranks_do: (LOOP_ZERO3_REAL, LOOP_ZERO3_REHEARSED),
}
"""The runs each test reads: the ``runs`` fixture starts those of the selected tests, the longest first."""


# -- accelerate's FSDP2 loading, on CPU ------------------------------------------------------------

FSDP2_LOADING = """
import os
from shardtop.inject import rehearsal
from shardtop.inject.rehearsal_env import Rehearsed

os.environ.update(Rehearsed(3, 4).environment())
rehearsal.install()
import torch
import torch.distributed as dist
from accelerate.utils.fsdp_utils import fsdp2_load_full_state_dict
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

dist.init_process_group("gloo")
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(5, 10), torch.nn.Linear(10, 3))
full = {name: value.clone() for name, value in model.state_dict().items()}
model = model.to("meta")
mesh = init_device_mesh("cpu", (4,))
for layer in model:
    fully_shard(layer, mesh=mesh)
fully_shard(model, mesh=mesh)

class NotTheMainProcess:
    is_main_process = False

fsdp2_load_full_state_dict(NotTheMainProcess(), model, full)
for name, value in model.state_dict().items():
    mine = torch.chunk(full[name], 4)[3] if len(full[name]) >= 4 else full[name][:0]
    print(name, tuple(value.to_local().shape), torch.equal(value.to_local(), mine))
"""


def test_accelerate_fsdp2_loading_deals_a_rehearsed_rank_its_own_rows() -> None:
    """Rank 0 broadcasts each parameter and every rank cuts its shard by a scatter from rank 0: through the
    fake group neither arrives, and rank 3 held uninitialised memory.  It now cuts its rows itself."""
    done = subprocess.run(
        [sys.executable, "-c", FSDP2_LOADING], cwd=ROOT, capture_output=True, text=True, timeout=120,
        env=user_env(), check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split("\n")[:4] == [
        "0.weight (1, 5) True",  # rows 9 of 10: torch.chunk deals 3, 3, 3 and 1
        "0.bias (1,) True",
        "1.weight (0, 10) True",  # 3 rows: ranks 0-2 take one each, rank 3 none
        "1.bias (0,) True",
    ], done.stdout
