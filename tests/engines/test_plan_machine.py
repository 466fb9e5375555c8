"""``shardtop plan PRESET`` plans the run ``shardtop launch PRESET`` would make on this machine, says
which machine it planned for, labels each figure with what it is, and offers only changes that apply
to the run's device.

Plans are cheap (the model on the meta device): these call the plan in this process, as
``shardtop plan`` does, and the real command once for what a user reads.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from shardtop.config import resolve
from shardtop.gpus import gpu_count
from shardtop.launch import resolve_devices
from shardtop.plan.command import read_request
from shardtop.plan.compare import Plan
from shardtop.plan.render import render_text
from shardtop.trace.presets import plan_config

ROOT = Path(__file__).resolve().parents[2]
PRESETS = ("zero3-linear", "zero3-linear-fixed", "fsdp2-mlp", "fsdp-not-sharding", "ddp-baseline",
           "manual-placement")
WHOLE_MODEL = "the whole model as built"


def _plan(*settings: str, detect_gpu: bool = False) -> Plan:
    request = read_request(list(settings), detect_gpu=detect_gpu)
    return plan_config(request.config, devices=request.devices, accelerator=request.accelerator, gpu=request.gpu)


@pytest.mark.parametrize("preset", PRESETS)
def test_on_a_machine_without_a_gpu_the_plan_is_of_the_run_launch_makes(preset: str) -> None:
    launched = resolve_devices(resolve(preset), lambda: 0)
    request = read_request([preset], detect_gpu=False)
    assert (request.accelerator, request.config["model"]) == ("cpu", launched["model"])
    assert request.config["gpu_mem_limit"] == launched["gpu_mem_limit"]
    assert request.devices == (1 if launched.get("single_process") else launched["devices"])
    assert "which has no GPU" in request.planned_for and f"shardtop launch {preset}" in request.planned_for


def test_on_this_machine_the_plan_and_launch_resolve_the_preset_alike() -> None:
    launched = resolve_devices(resolve("zero3-linear", [("max_steps", "3")]), gpu_count)
    request = read_request(["zero3-linear", "max_steps=3"])
    assert (request.accelerator, request.devices) == (launched["accelerator"], launched["devices"])
    assert request.config["model"] == launched["model"]


def test_the_story_2_sizes_differ_between_the_machines_and_each_plan_says_which_it_is() -> None:
    on_cpu_layers = resolve_devices(resolve("zero3-linear"), lambda: 0)["model"]["n_layers"]
    assert on_cpu_layers < 18000
    here = _plan("zero3-linear")
    assert (here.accelerator, here.devices) == ("cpu", 2)
    assert here.model == f"SequentialLinear(n_layers={on_cpu_layers}, width=512)"
    gpus = read_request(["zero3-linear", "devices=6", "gpu=16GiB"], detect_gpu=False)
    assert (gpus.accelerator, gpus.devices, gpus.config["model"]["n_layers"]) == ("cuda", 6, 18000)
    assert gpus.planned_for == "GPUs, as asked (gpu=16GiB)"
    asked = read_request(["zero3-linear", "accelerator=cuda"], detect_gpu=False)
    assert (asked.accelerator, asked.config["model"]["n_layers"]) == ("cuda", 18000)
    more = read_request(["zero3-linear", "devices=6"], detect_gpu=False)  # the count alone keeps the machine
    assert (more.accelerator, more.devices, more.config["model"]["n_layers"]) == ("cpu", 6, on_cpu_layers)
    on_cpu = read_request(["zero3-linear", "accelerator=cpu"], detect_gpu=False)
    assert on_cpu.planned_for == "CPU processes with the preset's CPU sizes, as asked (accelerator=cpu)"


def test_the_command_says_it_planned_for_this_machine() -> None:
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-m", "shardtop", "plan", "zero3-linear", "--format", "json"],
                          capture_output=True, text=True, timeout=120, env=env, cwd=ROOT, check=False)
    assert done.returncode == 0, done.stderr
    plan: dict[str, Any] = json.loads(done.stdout)
    launched = resolve_devices(resolve("zero3-linear"), gpu_count)
    assert (plan["accelerator"], plan["devices"]) == (launched["accelerator"], launched["devices"])
    assert f"n_layers={launched['model']['n_layers']}" in plan["model"]["name"]
    assert "shardtop launch zero3-linear" in plan["planned_for"]


@pytest.mark.parametrize(
    "settings",
    [
        ("zero3-linear", "model.n_layers=96", "gpu_mem_limit=80MiB"),  # on CPU: 96.2 MiB, moved whole first
        ("zero3-linear", "model.n_layers=96", "gpu_mem_limit=150MiB"),  # on CPU: past it, DeepSpeed's buffers
        ("zero3-linear", "devices=6", "gpu=16GiB"),  # story 2 as asked on six GPUs
        ("zero3-linear", "gpu=80GB"),  # one GPU: the partitions are the whole model
        ("zero3-linear-fixed", "devices=2", "gpu=2GiB"),
        ("fsdp2-mlp", "gpu_mem_limit=100MiB"),
    ],
)
def test_each_label_is_the_figure_it_names(settings: tuple[str, ...]) -> None:
    plan = _plan(*settings)
    for o in plan.options:
        if o.dominant.startswith(WHOLE_MODEL):
            assert o.dominant_bytes == plan.param_bytes, (o.strategy.label, o.note)
        elif o.runs_out_at == "set-up" or o.per_rank.peak_phase == "set-up":
            assert o.dominant_bytes <= o.per_rank.setup, (o.strategy.label, o.note)


def test_the_issues_labels_name_their_own_figures() -> None:
    """On CPU the 96.2 MiB model was labelled with its 2 GiB set-up; on one GPU the 17.6 GiB model with the
    70.4 GiB that ZeRO-3's set-up needs there (the persistent biases are views of their partitions at one rank)."""
    cpu = _plan("zero3-linear", "model.n_layers=96", "gpu_mem_limit=80MiB")
    assert cpu.asked.runs_out_at == "set-up"
    assert cpu.asked.note == (f"out of memory at set-up: {WHOLE_MODEL}, on every rank before the engine splits it "
                              "(96.2 MiB)")
    one_gpu = _plan("zero3-linear", "gpu=80GB")
    assert one_gpu.asked.runs_out_at == "set-up" and WHOLE_MODEL not in one_gpu.asked.note
    assert one_gpu.asked.note == ("out of memory at set-up: the engine's set-up, up to the gradient partitions "
                                  "(70.4 GiB)")
    assert "(70.4 GiB)" in " ".join(render_text(one_gpu).split())


def test_a_cpu_run_is_offered_no_offload_and_a_gpu_run_still_is() -> None:
    cpu = _plan("zero3-linear", "model.n_layers=96", "gpu_mem_limit=150MiB")
    assert cpu.accelerator == "cpu"
    assert not [o.strategy.label for o in cpu.options if o.strategy.offload_params or o.strategy.offload_optimizer]
    assert cpu.verdict.change is None or "offload" not in cpu.verdict.change.strategy.label
    assert "offload" not in render_text(cpu)
    gpu = _plan("zero3-linear", "devices=6", "gpu=16GiB")
    assert gpu.verdict.change is not None and gpu.verdict.change.strategy.label == "ZeRO-3, fp32, optimizer offload"
