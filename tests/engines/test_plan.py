"""``shardtop plan``: story 2's numbers, the command line, bad input, speed, an unseen model.

The presets against real runs are in ``test_plan_presets.py`` (CPU) and
``test_plan_recordings.py`` (the GPU recordings); DeepSpeed's own estimator
in ``test_plan_deepspeed.py``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from shardtop.plan.cards import CARDS, judged_against, parse_gpu
from shardtop.plan.command import read_request
from shardtop.plan.memory import CUDA_WORKSPACES, per_rank
from shardtop.plan.render import render_markdown, render_text, verdict_lines
from shardtop.plan.strategies import ADAMW, SGD_MOMENTUM, Strategy
from shardtop.trace.describe import describe_model
from shardtop.trace.meta import build_on_meta
from shardtop.trace.presets import plan_config
from shardtop.units import GiB
from tests.support.live_bytes import LiveBytes

ROOT = Path(__file__).resolve().parents[2]
STORY2_PARAMS = 18000 * (512 * 512 + 512)
STORY2_BIASES = 18000 * 512


def shardtop_plan(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """``shardtop plan ARGS`` as a user runs it (its speed: ``bench/bench_rehearse.py``)."""
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "shardtop", "plan", *args], capture_output=True, text=True,
                          timeout=timeout, env=env, cwd=ROOT, check=False)


@pytest.fixture(scope="module")
def story2() -> dict[str, Any]:
    """Both plans of story 2 on six 16 GiB cards, through the real command."""
    asked = {
        "zero3-linear": ("zero3-linear", "devices=6", "gpu=16GiB", "--format", "json"),
        "zero3-linear-fixed": ("zero3-linear-fixed", "devices=6", "gpu=16GiB", "--format", "json"),
        "text": ("zero3-linear", "devices=6", "gpu=16GiB"),
    }
    with ThreadPoolExecutor(2) as pool:  # the three commands two at a time: each waits on its imports
        done = dict(zip(asked, pool.map(lambda words: shardtop_plan(*words), asked.values()), strict=True))
    out: dict[str, Any] = {}
    for preset in ("zero3-linear", "zero3-linear-fixed"):
        assert done[preset].returncode == 0, done[preset].stderr
        out[preset] = {"plan": json.loads(done[preset].stdout)}
    out["text"] = done["text"].stdout
    return out


def test_story2_as_asked_runs_out_at_setup_with_the_whole_fp32_model(story2: dict[str, Any]) -> None:
    plan = story2["zero3-linear"]["plan"]
    asked = plan["options"][0]
    assert plan["asked"] == asked["strategy"] and asked["built_whole"] and asked["engine"] == "zero3"
    assert plan["model"]["params"] == STORY2_PARAMS and plan["model"]["bytes"] == 4 * STORY2_PARAMS
    assert plan["devices"] == 6 and plan["gpu_bytes"] == 16 * GiB
    assert asked["fits"] is False and asked["runs_out_at"] == "set-up"
    assert asked["per_rank"]["phases"]["setup"] == 4 * STORY2_PARAMS  # 17.6 GiB on every rank
    assert plan["verdict"]["fits"] is False and plan["verdict"]["runs_out_at"] == "set-up"
    text = " ".join(story2["text"].split())
    assert "does not fit: out of memory at set-up" in text and "whole model as built" in text and "17.6 GiB" in text
    assert "outside deepspeed.zero.Init" in text


def test_story2_fixed_holds_a_sixth_of_the_parameters_and_says_whether_the_rest_fits(story2: dict[str, Any]) -> None:
    plan = story2["zero3-linear-fixed"]["plan"]
    asked = plan["options"][0]
    assert not asked["built_whole"]
    sixth = -(-STORY2_PARAMS // 6)
    # each rank: its sixth of every parameter, plus the biases DeepSpeed keeps whole (under 1e5 elements each)
    assert asked["per_rank"]["params"] == 4 * (sixth + STORY2_BIASES)
    # set-up holds four fp32 partitions: the flat parameters, the fp32 master copy, the optimizer's freed
    # gradient buffer (cut for the reduce bucket, so the allocator keeps it) and the gradient partitions
    assert asked["per_rank"]["phases"]["setup"] == 4 * (4 * sixth + STORY2_BIASES) < plan["gpu"]["usable_bytes"]
    # fp32 ZeRO-3 with AdamW: 4 bytes of gradient, 12 of master copy and state per element, plus the step's copies
    assert asked["per_rank"]["optimizer"] == 12 * sixth
    assert asked["fits"] is False and asked["runs_out_at"] == "optimizer step"
    assert "out of memory at the first optimizer step" in asked["note"]
    change = plan["verdict"]["change"]
    assert change is not None
    chosen = next(o for o in plan["options"] if o["strategy"] == change)
    assert chosen["fits"] is True


def test_text_and_markdown_say_the_same_verdict() -> None:
    request = read_request(["fsdp-not-sharding", "devices=2", "gpu=2GiB"], detect_gpu=False)
    plan = plan_config(request.config, devices=request.devices, accelerator=request.accelerator, gpu=request.gpu)
    text, md = render_text(plan), render_markdown(plan)
    assert plan.verdict.fits is False and plan.verdict.change is not None
    flat_text = " ".join(text.split())
    for line in verdict_lines(plan):
        assert " ".join(line.split()) in flat_text and f"- {line}" in md
    assert f"| **{plan.asked.strategy.label}** (as run) |" in md
    assert "hand in configure_sharded_model" in text


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["no-such-preset"], "unknown preset 'no-such-preset'"),
        (["zero3-linear", "model.layers=4"], "unknown key 'model.layers'"),
        (["zero3-linear", "gpu=banana"], "gpu=banana: expected a size such as 16GiB"),
        (["zero3-linear", "devices=0"], "devices=0: expected a number of devices, 1 or more"),
        (["zero3-linear", "devices=many"], "devices=many: expected a number of devices"),
        (["train.py"], "To plan your own command, put it after --"),
    ],
)
def test_bad_input_says_what_to_type_and_exits_2(args: list[str], expected: str) -> None:
    done = shardtop_plan(*args)
    assert done.returncode == 2, done.stdout + done.stderr
    assert expected in done.stderr and "Traceback" not in done.stderr
    if "gpu=" in expected:
        assert all(name in done.stderr for name in CARDS)


def test_gpu_takes_a_size_or_a_known_card() -> None:
    assert parse_gpu("16GiB").total == 16 * GiB
    assert parse_gpu("80GB").total == 80 * 10**9
    assert parse_gpu("a100-80gb").name == "A100-80GB"
    assert parse_gpu("NVIDIA H200").total == CARDS["H200"]
    assert parse_gpu("H100").name == "H100-80GB"
    assert parse_gpu("16GiB").usable < 16 * GiB  # CUDA's own memory and fragmentation are kept aside


def test_gpu_mem_limit_acts_as_the_card_and_devices_is_not_limited_by_this_machine() -> None:
    request = read_request(["zero3-linear", "accelerator=cuda", "gpu_mem_limit=15GiB", "devices=64"],
                           detect_gpu=False)
    assert request.devices == 64 and request.accelerator == "cuda"
    assert request.gpu is not None and request.gpu.total == 15 * GiB and request.gpu.source == "gpu_mem_limit"
    assert request.config["model"]["n_layers"] == 18000
    on_cpu = read_request(["zero3-linear", "accelerator=cpu"], detect_gpu=False)
    assert on_cpu.accelerator == "cpu" and on_cpu.config["model"]["n_layers"] == 96
    assert on_cpu.gpu == judged_against(None, on_cpu.config["gpu_mem_limit"])  # the preset's CPU cap, if any


def test_no_gpu_given_or_found_means_fits_is_not_judged() -> None:
    done = shardtop_plan("fsdp2-mlp", "--format", "json")
    assert done.returncode == 0, done.stderr
    plan = json.loads(done.stdout)
    assert plan["gpu_bytes"] is None and plan["verdict"]["fits"] is None
    assert all(o["fits"] is None for o in plan["options"])
    assert all(isinstance(v, int) for o in plan["options"] for k, v in o["per_rank"].items() if k != "phases")


class _UnseenNet(nn.Module):
    """A model no preset has: token embedding, torch's own TransformerEncoder, a vocabulary head."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(1000, 256)
        layer = nn.TransformerEncoderLayer(256, 8, 1024, dropout=0.0, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, 4, enable_nested_tensor=False)
        self.head = nn.Linear(256, 1000)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.encoder(self.embed(x)))


@pytest.mark.parametrize("optimizer", [ADAMW, SGD_MOMENTUM], ids=lambda o: o.name)
def test_a_model_the_plan_has_never_seen_is_planned_within_ten_percent_of_a_real_step(optimizer: Any) -> None:
    """Two real training steps on CPU tensors, every storage counted, against the plan of the same model."""
    batch, length = 8, 64

    def loss_of(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return nn.functional.cross_entropy(model(x).flatten(0, 1), y.flatten())

    torch.manual_seed(0)
    measured = LiveBytes()
    with measured:
        model = _UnseenNet()
        opt = (torch.optim.AdamW(model.parameters()) if optimizer is ADAMW
               else torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9))
        x, y = torch.randint(0, 1000, (batch, length)), torch.randint(0, 1000, (batch, length))
        for _ in range(2):
            loss_of(model, x, y).backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
    xm = torch.empty(batch, length, dtype=torch.long, device="meta")
    desc = describe_model(build_on_meta(_UnseenNet), lambda m: loss_of(m, xm, xm), name="unseen",
                          batch_size=batch, input_bytes=2 * batch * length * 8)
    planned = per_rank(desc, Strategy(engine="single", optimizer=optimizer), 1, gpu=False)
    assert planned.params == sum(p.numel() * 4 for p in model.parameters())
    assert abs(planned.peak - measured.peak) <= 0.10 * measured.peak, (planned.peak, measured.peak)


class _Adapted(nn.Module):
    """LoRA's mix of dtypes: a frozen bf16 base layer beside the fp32 adapters that train."""

    def __init__(self) -> None:
        super().__init__()
        self.base = nn.Linear(256, 256, bias=False, dtype=torch.bfloat16).requires_grad_(False)
        self.down = nn.Linear(256, 8, bias=False)
        self.up = nn.Linear(8, 256, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.base(x.bfloat16()).float() + self.up(self.down(x))


def test_a_frozen_base_in_another_dtype_is_planned_at_the_bytes_it_stores() -> None:
    """Each parameter at its own bytes (the frozen bf16 base at two a element, whichever comes first), its
    count as its own elements; gradients and AdamW's state in the adapters' dtype, for the adapters alone."""
    model = build_on_meta(_Adapted)
    desc = describe_model(model, None, name="adapted", batch_size=1, input_bytes=0)
    adapters = 2 * 256 * 8
    assert desc.param_elements == 256 * 256 + adapters
    assert desc.param_bytes == 256 * 256 * 2 + adapters * 4
    planned = per_rank(desc, Strategy(engine="single", optimizer=ADAMW), 1, gpu=False)
    assert (planned.params, planned.grads, planned.optimizer) == (desc.param_bytes, adapters * 4, 2 * adapters * 4)


def test_planning_from_a_description_imports_no_torch() -> None:
    """A launch prompt replans on each keystroke in the TUI process, which never imports torch."""
    script = (
        "import sys\n"
        "from shardtop.plan import cards, compare, json_plan, options, preset_strategies, presets, render, verdict\n"
        "print(sorted(n for n in ('torch', 'textual', 'lightning', 'deepspeed') if n in sys.modules))\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=ROOT, check=False,
                          env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def test_the_plan_of_story_2_at_4000_layers_needs_what_two_h200s_measured() -> None:
    """4000 layers on two H200s (``bench/RESULTS.md``, "two H200s, before the recordings"): fixed, capped at
    15 GiB, the first Adam step ran out asking for 1.96 GiB with 12.55 GiB allocated; capped at 3.5 GB, set-up
    ran out in ``_configure_zero_optimizer`` on a 1.96 GiB buffer (the fp32 master copy, beside the flat
    partitions).  At 15 GiB the plan's need, 14.51 GiB, is under the cap: that it does not fit is the
    allocator allowance's verdict (``FRAGMENTATION``), set from the rehearsal of this run."""
    request = read_request(["zero3-linear-fixed", "model.n_layers=4000", "devices=2", "gpu_mem_limit=15GiB"],
                           detect_gpu=False)
    plan = plan_config(request.config, devices=2, accelerator="cuda", gpu=request.gpu)
    asked = plan.asked
    step = asked.per_rank.phases[3]
    assert abs(step - (12.55 + 1.96) * GiB) <= 0.01 * step
    assert request.gpu is not None and request.gpu.usable < step < 15 * GiB
    assert asked.fits is False and asked.runs_out_at == "optimizer step"
    assert abs(asked.per_rank.step_temporary / 2 - 1.96 * GiB) <= 0.01 * 1.96 * GiB  # the asked-for sqrt(exp_avg_sq)

    small = read_request(["zero3-linear-fixed", "model.n_layers=4000", "devices=2", "gpu_mem_limit=3.5GB"],
                         detect_gpu=False)
    plan = plan_config(small.config, devices=2, accelerator="cuda", gpu=small.gpu)
    assert plan.asked.runs_out_at == "set-up"
    partitions = plan.asked.per_rank.params
    assert abs(partitions - 1.96 * GiB) <= 0.01 * partitions
    assert small.gpu is not None and partitions < small.gpu.usable < 2 * partitions  # flat, then the fp32 copy
    assert "the engine's set-up, up to the fp32 master copy" in plan.asked.note


def _planned(*args: str) -> Any:
    request = read_request([*args, "accelerator=cuda"], detect_gpu=False)
    return plan_config(request.config, devices=request.devices, accelerator="cuda", gpu=request.gpu).asked


def test_the_plan_puts_deepspeeds_set_up_and_first_step_where_the_h200_runs_ran_out() -> None:
    """15 GiB caps: on two H200s 8000 layers ran out in ``_configure_zero_optimizer`` and 2000 trained (peak
    8,456,457,728 B; ``bench/RESULTS.md``, "two H200s, before the recordings"); rehearsed as rank 0 of six
    (``tests/fixtures/runs/h200-rehearsal``), story 2 fixed ran out in the first Adam step with 12.55 GiB
    allocated asking for 2.94 GiB, and as asked inside ``deepspeed.initialize``."""
    at_8000 = _planned("zero3-linear-fixed", "model.n_layers=8000", "devices=2", "gpu_mem_limit=15GiB")
    assert at_8000.runs_out_at == "set-up"
    assert "the engine's set-up, up to the gradient partitions" in at_8000.note

    at_2000 = _planned("zero3-linear-fixed", "model.n_layers=2000", "devices=2", "gpu_mem_limit=15GiB")
    assert at_2000.fits is True
    assert abs(at_2000.per_rank.peak - 8_456_457_728) <= 0.01 * 8_456_457_728

    fixed = _planned("zero3-linear-fixed", "devices=6", "gpu_mem_limit=15GiB")
    assert fixed.runs_out_at == "optimizer step"
    p, partition = fixed.per_rank, -(-STORY2_PARAMS // 6) * 4
    # what the first forward held (parameters, gradient partitions, reduce bucket, cuBLAS workspaces, fp32
    # master), the step's fp32 copy of the gradient partition; then Adam asks for its first moment
    before_adam = p.params + p.grads + p.buffers + CUDA_WORKSPACES + 2 * partition
    assert abs(before_adam - 12.55 * GiB) <= 0.01 * before_adam
    assert abs(partition - 2.94 * GiB) <= 0.01 * partition
    assert p.setup < p.timeline[3]

    as_asked = _planned("zero3-linear", "devices=6", "gpu_mem_limit=15GiB")
    assert as_asked.runs_out_at == "set-up" and as_asked.per_rank.setup == 4 * STORY2_PARAMS
