"""A rehearsal holds exactly what the real rank holds: real engines on CPU, read as a user reads them.

One user script (``tests/own_scripts/rehearse_engines.py``, nothing of
shardtop in it) trains with FSDP1, FSDP2, DDP or DeepSpeed ZeRO-1/2/3 (ZeRO-1 is
read from real runs in ``test_shards.py``; its rehearsal goes the way of ZeRO-2's,
through the same DeepSpeed optimizer, and is left out here).  What
a user checks is the report JSON: per module, each rank's bytes, device and
sharding state with its gradient and optimizer bytes; per rank, its
parameter, gradient and optimizer bytes.

- ``shardtop rehearse devices=2 rank=0,last -- torchrun --nproc_per_node 2 ...``
  against ``shardtop run -- torchrun --nproc_per_node 2 ...`` (two real gloo
  processes): every figure equal, rank by rank.
- ``devices=64``: rank 0 and the last rank hold the share
  the engine's own arithmetic gives them (FSDP1: the flat unit cut in
  ``world`` chunks of ``ceil(numel / world)``, the last padded; FSDP2: each
  parameter's dim 0 cut as ``torch.chunk`` cuts it; ZeRO-3: each parameter's
  ``ds_numel`` cut in partitions of ``ceil(ds_numel / world)``), the uneven or
  empty last share included.

Each run is made once: the ``runs`` fixture starts the runs of the selected
tests at the start, four at a time, and each test waits for its own: 13 runs.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch

from shardtop.rundir.run_directory import list_runs
from tests.own_scripts.rehearse_engines import Net
from tests.support.cli import shardtop
from tests.support.own_job_runs import user_env

SCRIPT = "tests/own_scripts/rehearse_engines.py"
DIM, HIDDEN, DEPTH = 22, 21, 2
"""The script's model: flat units of 1011 and 575 elements, rows of 22, 21 and 3: uneven at 2 and 64, where
FSDP2's rows of 3 leave the last rank nothing."""
ENGINES = ("fsdp1", "fsdp2", "ddp", "zero2", "zero3")
REPLICATED = ("ddp", "zero2")
"""Engines that keep every parameter whole on every rank (ZeRO-2 partitions gradients and the optimizer only)."""
WORLDS = (64,)
AT_THE_SAME_TIME = 4
"""Runs started at once: a rank spends much of its life importing torch and waiting on its launcher."""
RUN_TIMEOUT = 300


@dataclass(frozen=True)
class Job:
    """One run of the script: a real one of ``world`` processes, or a rehearsal of rank 0 and the last."""

    engine: str
    world: int
    rehearsed: bool

    def arguments(self) -> list[str]:
        command = ["torchrun", "--nproc_per_node", str(self.world), SCRIPT, "--engine", self.engine,
                   "--dim", str(DIM), "--hidden", str(HIDDEN), "--depth", str(DEPTH)]
        if self.rehearsed:
            return ["rehearse", f"devices={self.world}", "rank=0,last", "--headless", "--", *command]
        return ["run", "--headless", "--", *command]

    def __str__(self) -> str:
        return f"{'rehearsal' if self.rehearsed else 'real run'} of {self.engine} at world {self.world}"


def run_and_report(job: Job, runs_dir: Path) -> dict[str, Any]:
    """The run as a user starts it, and its report as ``shardtop report RUN --format json`` gives it."""
    done = shardtop(*job.arguments(), runs_dir=runs_dir, timeout=RUN_TIMEOUT, env=user_env())
    runs = list_runs(runs_dir)
    logs = "\n".join(p.read_text(errors="replace")[-3000:] for r in runs for p in r.logs_dir.glob("command-*.log"))
    assert done.returncode == 0 and len(runs) == 1, (
        f"{job}: exit {done.returncode}\n{done.stdout[-3000:]}{done.stderr[-3000:]}\n--- command ---\n{logs}"
    )
    report = shardtop("report", str(runs[0].path), "--format", "json", runs_dir=runs_dir, env=user_env())
    assert report.returncode == 0, report.stderr[-3000:]
    result: dict[str, Any] = json.loads(report.stdout)
    return result


class Runs:
    """The runs the selected tests need, started together, a few at a time; a test waits for its own."""

    def __init__(self, jobs: list[Job], root: Path) -> None:
        self._pool = ThreadPoolExecutor(max_workers=AT_THE_SAME_TIME)
        self._reports: dict[Job, Future[dict[str, Any]]] = {}
        for i, job in enumerate(jobs):
            self._reports[job] = self._pool.submit(run_and_report, job, root / f"runs-{i}")

    def report(self, job: Job) -> dict[str, Any]:
        return self._reports[job].result()

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)


@pytest.fixture(scope="module")
def runs(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Runs]:
    wanted: dict[Job, None] = {}
    for item in request.session.items:
        if isinstance(item, pytest.Function) and item.function in JOBS_OF_TEST:
            wanted.update(dict.fromkeys(JOBS_OF_TEST[item.function](item.callspec.params)))
    longest_first = sorted(wanted, key=lambda job: (not job.rehearsed, not job.engine.startswith("zero")))
    started = Runs(longest_first, tmp_path_factory.mktemp("rehearse-engines"))
    yield started
    started.close()


# -- what a user reads from the report -------------------------------------------------------


def holdings(report: dict[str, Any]) -> dict[str, dict[int, dict[str, Any]]]:
    """Per module with parameters of its own, per rank: its bytes, device, state, gradient and optimizer bytes."""
    return {
        m["path"]: {h["rank"]: {k: v for k, v in h.items() if k not in ("rank", "act_bytes")} for h in m["ranks"]}
        for m in report["modules"]
        if m["params"]
    }


def modules(report: dict[str, Any]) -> list[tuple[str, str, int, int, str | None]]:
    """The module tree as the report gives it: path, type, parameters and bytes at full size, unit kind."""
    return [(m["path"], m["type"], m["params"], m["bytes"], m.get("unit")) for m in report["modules"]]


def rank_totals(report: dict[str, Any]) -> dict[int, tuple[str, int, int, int]]:
    """Per rank: which snapshot, its parameter, gradient and optimizer bytes."""
    return {r["rank"]: (r["snapshot"], r["param_bytes"], r["grad_bytes"], r["optim_bytes"]) for r in report["ranks"]}


# -- world 2: the rehearsal against the real run ---------------------------------------------


@pytest.mark.parametrize("engine", ENGINES)
def test_a_rehearsed_rank_holds_what_the_real_rank_holds(runs: Runs, engine: str) -> None:
    rehearsed, real = runs.report(Job(engine, 2, True)), runs.report(Job(engine, 2, False))
    for report in (rehearsed, real):
        assert (report["engine"], report["world_size"]) == (engine, 2)
        assert [r["rank"] for r in report["ranks"]] == [0, 1]
        assert {r["snapshot"] for r in report["ranks"]} == {"step"}  # after a step: gradients and optimizer state
    assert modules(rehearsed) == modules(real)

    held, real_held = holdings(rehearsed), holdings(real)
    for path, ranks in real_held.items():
        for rank in (0, 1):
            assert held[path][rank] == ranks[rank], (engine, path, rank)
    assert held == real_held
    assert rank_totals(rehearsed) == rank_totals(real)

    # What was compared is the engine's layout, not an empty or a trivial one.
    full = {m["path"]: m["bytes"] for m in real["modules"]}
    state = "replicated" if engine in REPLICATED else "sharded"
    for path, ranks in real_held.items():
        assert {h["state"] for h in ranks.values()} == {state}, (engine, path)
        assert {h["device"] for h in ranks.values()} == {"cpu"}, (engine, path)
        assert sum(h["bytes"] for h in ranks.values()) == full[path] * (2 if engine in REPLICATED else 1)
    optim = [sum(ranks[r]["optim_bytes"] for ranks in real_held.values()) for r in (0, 1)]
    assert all(optim), (engine, optim)
    if engine != "ddp":  # uneven sizes: the two ranks hold different shares (of the optimizer, for ZeRO-2)
        assert {p: h[0] for p, h in real_held.items()} != {p: h[1] for p, h in real_held.items()}


# -- world 64: each rank's share by the engine's own arithmetic -----------------------


def chunk(numel: int, world: int, rank: int) -> tuple[int, int]:
    """Elements ``[start, end)`` of ``rank``'s chunk: ``world`` chunks of ``ceil(numel / world)``, the last ones
    short or empty (``torch.chunk`` on a flat tensor, FSDP1's flat shards, ZeRO-3's partitions)."""
    size = math.ceil(numel / world)
    start = min(numel, rank * size)
    return start, min(numel, start + size)


def owner(name: str) -> str:
    return name.rpartition(".")[0]


def fsdp1_share(model: Net, world: int, rank: int) -> dict[str, int]:
    """FSDP1: each unit (a block; the root's own parameters) flattened in registration order and chunked."""
    units = [[(f"blocks.{i}.{n}", p) for n, p in block.named_parameters()] for i, block in enumerate(model.blocks)]
    in_blocks = {n for unit in units for n, _ in unit}
    units.append([(n, p) for n, p in model.named_parameters() if n not in in_blocks])
    share: dict[str, int] = {}
    for unit in units:
        low, high = chunk(sum(p.numel() for _, p in unit), world, rank)
        offset = 0
        for name, param in unit:
            held = max(0, min(offset + param.numel(), high) - max(offset, low))
            share[owner(name)] = share.get(owner(name), 0) + held * param.element_size()
            offset += param.numel()
    return share


def fsdp2_share(model: Net, world: int, rank: int) -> dict[str, int]:
    """FSDP2: each parameter's rows (dim 0) as ``torch.chunk`` deals them, no chunk for the ranks past the last."""
    share: dict[str, int] = {}
    for name, param in model.named_parameters():
        chunks = param.chunk(world, dim=0)
        held = chunks[rank].numel() if rank < len(chunks) else 0
        share[owner(name)] = share.get(owner(name), 0) + held * param.element_size()
    return share


def zero3_share(model: Net, world: int, rank: int) -> dict[str, int]:
    """ZeRO-3: each parameter's ``ds_numel`` elements in partitions of ``ceil(ds_numel / world)``."""
    share: dict[str, int] = {}
    for name, param in model.named_parameters():
        start, end = chunk(param.numel(), world, rank)
        share[owner(name)] = share.get(owner(name), 0) + (end - start) * param.element_size()
    return share


SHARES: dict[str, Callable[[Net, int, int], dict[str, int]]] = {
    "fsdp1": fsdp1_share, "fsdp2": fsdp2_share, "zero3": zero3_share,
}
OPTIMIZER_PER_BYTE = {"fsdp1": 1, "fsdp2": 1, "zero3": 2}
"""Optimizer bytes per byte of parameter held: SGD's momentum, and for ZeRO-3 its fp32 master partition too."""
UNIT_ROOTS = {"fsdp1": {"", "blocks.0", "blocks.1"}, "fsdp2": {"", "blocks.0", "blocks.1"}, "zero3": {""}}


@pytest.fixture(scope="module")
def model() -> Net:
    with torch.device("meta"):
        return Net(DIM, HIDDEN, DEPTH)


@pytest.mark.parametrize("world", WORLDS)
@pytest.mark.parametrize("engine", tuple(SHARES))
def test_each_rehearsed_rank_holds_its_share(runs: Runs, model: Net, engine: str, world: int) -> None:
    report = runs.report(Job(engine, world, True))
    last = world - 1
    assert (report["engine"], report["world_size"]) == (engine, world)
    assert [r["rank"] for r in report["ranks"]] == [0, last]
    assert {m["path"] for m in report["modules"] if m.get("unit") == engine} == UNIT_ROOTS[engine]

    full = {m["path"]: m["bytes"] for m in report["modules"] if m["params"]}
    share = SHARES[engine]
    every_rank = [share(model, world, r) for r in range(world)]
    assert {p: sum(s[p] for s in every_rank) for p in full} == full  # the arithmetic deals out the whole model
    assert every_rank[0] != every_rank[last]  # and the last rank's share is not rank 0's

    held = holdings(report)
    totals = rank_totals(report)
    for rank in (0, last):
        expected = every_rank[rank]
        assert {p: h[rank]["bytes"] for p, h in held.items()} == expected, (engine, world, rank)
        assert {p: h[rank]["grad_bytes"] for p, h in held.items()} == expected, (engine, world, rank)
        optim = {p: b * OPTIMIZER_PER_BYTE[engine] for p, b in expected.items()}
        assert {p: h[rank]["optim_bytes"] for p, h in held.items()} == optim, (engine, world, rank)
        assert {(h[rank]["state"], h[rank]["device"]) for h in held.values()} == {("sharded", "cpu")}
        mine = sum(expected.values())
        assert totals[rank] == ("step", mine, mine, mine * OPTIMIZER_PER_BYTE[engine]), (engine, world, rank)


JOBS_OF_TEST: dict[Callable[..., None], Callable[[dict[str, Any]], list[Job]]] = {
    test_a_rehearsed_rank_holds_what_the_real_rank_holds: lambda p: [Job(p["engine"], 2, True),
                                                                     Job(p["engine"], 2, False)],
    test_each_rehearsed_rank_holds_its_share: lambda p: [Job(p["engine"], p["world"], True)],
}
"""The runs each test reads, from its parameters: the ``runs`` fixture starts those of the selected tests."""
