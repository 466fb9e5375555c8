"""``shardtop plan PRESET [key=value ...] [devices=N] [gpu=SIZE|CARD] [--format ...]``.

The settings are read like ``shardtop launch``'s (a preset and overrides,
checked by ``shardtop.config``), with two of the plan's own: ``gpu=`` (the
card to fit, a size or a known name) and ``devices=`` (any number: a plan
is not limited to the GPUs here).  The plan is for GPUs unless
``accelerator=cpu`` asks for CPU processes (then the preset's CPU sizes).
"""

from __future__ import annotations

import os
import shlex
import shutil
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from shardtop.config import (
    ConfigError,
    apply_cpu_defaults,
    preset_names,
    resolve,
    split_overrides,
)
from shardtop.plan.cards import Gpu, UnknownGpu, judged_against, local_gpu, parse_gpu

CPU_DEFAULT_DEVICES = 2
"""As ``shardtop launch`` runs a preset on a machine without GPUs."""


@dataclass(frozen=True)
class PlanRequest:
    """What to plan, once the command line is read."""

    config: dict[str, Any]
    devices: int
    accelerator: str
    gpu: Gpu | None


def devices_setting(raw: str) -> int | None:
    """``devices=`` as typed: a positive number, or auto (None)."""
    text = raw.strip()
    if text == "auto":
        return None
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise ConfigError(f"devices={raw}: expected a number of devices, 1 or more (e.g. devices=6), or auto.")
    return value


def read_request(settings: Sequence[str], *, detect_gpu: bool = True) -> PlanRequest:
    """Resolve the preset and overrides; pick the devices and the GPU to fit."""
    settings = list(settings)
    if settings and "=" not in settings[0] and settings[0] not in preset_names() and _looks_like_command(settings[0]):
        raise ConfigError(
            f"{settings[0]!r} is no preset. To plan your own command, put it after --, e.g.\n"
            f"  shardtop plan -- {shlex.join(settings)}\n"
            f"or plan a preset: {', '.join(preset_names())}."
        )
    preset, pairs = split_overrides(settings)
    gpu_text: str | None = None
    devices: int | None = None
    rest: list[tuple[str, str]] = []
    for key, raw in pairs:
        if key == "gpu":
            gpu_text = raw
        elif key == "devices":
            devices = devices_setting(raw)
        else:
            rest.append((key, raw))
    config = resolve(preset, rest)
    accelerator = "cpu" if config.get("accelerator") == "cpu" else "cuda"
    if accelerator == "cpu":
        config = apply_cpu_defaults(config)
    try:
        chosen = parse_gpu(gpu_text) if gpu_text is not None else None
    except UnknownGpu as e:
        raise ConfigError(str(e)) from None
    chosen = judged_against(chosen, config.get("gpu_mem_limit"))
    needs_local = chosen is None or devices is None
    here = local_gpu() if detect_gpu and accelerator == "cuda" and needs_local else None
    if chosen is None and accelerator == "cuda":
        chosen = here
    if devices is None:
        devices = _local_count() if accelerator == "cuda" and here is not None else (
            CPU_DEFAULT_DEVICES if accelerator == "cpu" else 1)
    if config.get("single_process") and accelerator == "cpu":
        devices = 1
    return PlanRequest(config=config, devices=devices, accelerator=accelerator, gpu=chosen)


def _local_count() -> int:
    from shardtop.gpus import gpu_count

    return max(1, gpu_count())


def _looks_like_command(word: str) -> bool:
    return word.endswith(".py") or "/" in word or shutil.which(word) is not None


def run_plan(settings: Sequence[str], output_format: str) -> str:
    """The plan, rendered: what ``shardtop plan`` prints."""
    from shardtop.plan.presets import plan_config

    request = read_request(settings)
    plan = plan_config(request.config, devices=request.devices, accelerator=request.accelerator, gpu=request.gpu)
    if output_format == "json":
        from shardtop.plan.json_plan import render_json

        return render_json(plan)
    from shardtop.plan.render import render_markdown, render_text

    return render_markdown(plan) if output_format == "markdown" else render_text(plan)


def leave_now(code: int) -> None:
    """End the process once the plan is printed, without the interpreter's teardown.

    Tracing on the meta device imports ``torch._dynamo`` (torch's Python meta
    kernels load it), and freeing it all at exit costs about 0.6 s of CPU,
    more than planning 18 000 layers.  Nothing is left to close: the plan
    opened no file and started no process.
    """
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
