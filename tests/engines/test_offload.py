"""ZeRO offload: what a rank holds on its device apart from what DeepSpeed keeps in host memory.

Two real 2-process gloo runs of ``zero3-linear-fixed`` (16 layers, two steps) with DeepSpeed's own offload
settings: ``zero.offload_optimizer=cpu`` alone, and with ``zero.offload_param=cpu``.  On CPU processes every
tensor is on ``cpu``, so where the state lives is what DeepSpeed says of it (``offload_optimizer``,
``offload_param``), and that is what the report must show: the offloaded bytes under ``offloaded``, not in
the rank's device columns.  The plan for GPUs leaves them out of its per-GPU figures and says the host needs
them; set against the same runs' offloaded bytes, as far as a CPU run can show them.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from shardtop.plan.cards import parse_gpu
from shardtop.plan.render import render_text
from shardtop.trace.presets import plan_config
from shardtop.units import ceil_div, format_bytes
from tests.diagnose_scripts.real_runs import RealRun, report_json, runs_base, story
from tests.support.cli import report as report_of

ADAMW_BYTES = 4 + 8
"""Per element of the rank's partition: ZeRO's fp32 master copy and AdamW's two fp32 moments."""
GRADIENT_BYTES = 4 + 4
"""Per element under ``offload_optimizer``, both on the host: ZeRO-3's fp32 gradient partition (its flat
buffer is made on the optimizer's device) and the fp32 gradient DeepSpeed keeps beside the master."""
TOLERANCE = 0.02


@pytest.fixture(scope="module")
def real_base(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return runs_base(tmp_path_factory)


def _runs(real_base: Path) -> dict[str, RealRun]:
    return {"optimizer": story(real_base, "zero3-linear-fixed-optimizer-offloaded"),
            "both": story(real_base, "zero3-linear-fixed-offloaded")}


@pytest.mark.parametrize("offloads", ["optimizer", "both"])
def test_the_report_puts_what_deepspeed_offloads_under_offloaded_not_on_the_device(
    real_base: Path, offloads: str
) -> None:
    real = _runs(real_base)[offloads]
    report = report_json(real)
    assert report["step"] == 2, real.describe()
    share = ceil_div(report["model"]["params"], 2)  # this rank's partition of the parameters, in elements
    states = share * ADAMW_BYTES
    grads = 0
    for rank in report["ranks"]:
        assert rank["status"] == "finished" and rank["snapshot"] == "step", real.describe()
        moved, here = rank["offloaded"], rank["on_device"]
        assert moved["optimizer"] == rank["optim_bytes"] == states and here["optimizer"] == 0
        assert moved["grads"] == rank["grad_bytes"] and here["grads"] == 0
        grads += moved["grads"]
        if offloads == "both":  # every partition offloaded (offload_param): nothing of it on the device
            assert moved["params"] == rank["param_bytes"] > 0 and here["params"] == 0
        else:
            assert moved["params"] == 0 and here["params"] == rank["param_bytes"] > 0
    assert grads == GRADIENT_BYTES * report["model"]["params"], "each gradient element twice, over the two ranks"
    text = report_of(real.path, "text")
    table = text[text.index("Per rank\n") : text.index("Plan against the run")]
    lines = table.splitlines()
    header = re.split(r"\s{2,}", next(line for line in lines if line.startswith("rank ")).strip())
    assert header[header.index("optimizer") :][:3] == ["optimizer", "offloaded", "allocator peak"], header
    for rank in report["ranks"]:
        row = next(line for line in lines if line.startswith(f"{rank['rank']} "))
        cells = dict(zip(header, re.split(r"\s{2,}", row.strip()), strict=True))
        assert (cells["grads"], cells["optimizer"]) == ("0 B", "0 B"), row
        assert cells["offloaded"] == format_bytes(sum(rank["offloaded"].values())), row
    assert "host memory" in table


@pytest.mark.parametrize("offloads", ["optimizer", "both"])
def test_the_plan_for_gpus_leaves_the_offloaded_state_out_of_the_gpu_and_says_the_host_needs_it(
    real_base: Path, offloads: str
) -> None:
    """The same configuration planned for 16 GiB GPUs: no optimizer state or gradients (nor, with
    ``offload_param``, parameter partitions) on the GPU; in host memory, what the CPU run's ranks held
    offloaded, within 2 %."""
    real = _runs(real_base)[offloads]
    config: dict[str, Any] = dict(real.run.read_meta().config.settings)
    plan = plan_config(config, devices=2, accelerator="cuda", gpu=parse_gpu("16GiB"))
    planned = plan.asked.per_rank
    assert (planned.optimizer, planned.grads) == (0, 0)
    report = report_json(real)
    for rank in report["ranks"]:
        moved = sum(rank["offloaded"].values())
        assert abs(planned.host - moved) <= TOLERANCE * moved, (planned.host, rank["offloaded"])
        if offloads == "both":
            assert planned.params < rank["param_bytes"] // 100, "only the parameters kept whole stay on the GPU"
        else:
            assert abs(planned.params - rank["on_device"]["params"]) <= TOLERANCE * rank["on_device"]["params"]
    said = " ".join(render_text(plan).split())
    assert f"Offloaded to host memory: {format_bytes(planned.host)} per rank" in said, said


def test_the_plan_on_cpu_processes_counts_the_offload_on_the_rank_as_the_run_held_it(real_base: Path) -> None:
    """On CPU processes what the offload moves stays in the process's memory: the plan the run wrote at set-up
    counts it on the rank, the fp32 gradient DeepSpeed keeps beside the offloaded master included, and the
    plan against the run compares like with like."""
    report = report_json(_runs(real_base)["optimizer"])
    share = ceil_div(report["model"]["params"], 2)
    for planned in report["plan"]["per_rank"]:
        predicted, measured = planned["predicted"], planned["measured"]
        assert (measured["grads"], measured["optimizer"]) == (GRADIENT_BYTES * share, ADAMW_BYTES * share), planned
        for kind in ("params", "grads", "optimizer"):
            assert abs(predicted[kind] - measured[kind]) <= TOLERANCE * measured[kind], (kind, planned)
