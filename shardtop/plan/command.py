"""``shardtop plan PRESET [key=value ...] [devices=N] [gpu=SIZE|CARD] [--format ...]``.

The settings are read like ``shardtop launch``'s (a preset and overrides,
checked by ``shardtop.config``), with two of the plan's own: ``gpu=`` (the
card to fit, a size or a known name) and ``devices=`` (any number: a plan
is not limited to the devices here).  Unless told otherwise the plan is of
what ``shardtop launch`` would run on this machine, resolved the same way
(``config.on_machine``): its GPUs, or without one CPU processes and the
preset's CPU sizes.  ``gpu=`` or ``accelerator=cuda`` plan GPUs anywhere,
``accelerator=cpu`` CPU processes; the plan says which it planned for.
"""

from __future__ import annotations

import os
import shlex
import shutil
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from shardtop.config import (
    ConfigError,
    on_machine,
    preset_names,
    resolve,
    split_overrides,
)
from shardtop.plan.cards import Gpu, UnknownGpu, judged_against, local_gpu, parse_gpu
from shardtop.words import plural


@dataclass(frozen=True)
class PlanRequest:
    """What to plan, once the command line is read."""

    config: Mapping[str, Any]
    devices: int
    accelerator: str
    gpu: Gpu | None
    planned_for: str = ""
    """Which machine the plan is for, and why, in words."""


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
    told = config.get("accelerator", "auto")
    if told == "auto" and gpu_text is not None:
        config["accelerator"] = "cuda"  # a card to fit is a plan for GPUs, on this machine or not
    if devices is not None:
        config["devices"] = devices
    gpus = _local_gpus() if detect_gpu and config.get("accelerator") != "cpu" else 0
    config, accelerator, devices = on_machine(config, gpus)
    try:
        card = parse_gpu(gpu_text) if gpu_text is not None else None
    except UnknownGpu as e:
        raise ConfigError(str(e)) from None
    if card is None and accelerator == "cuda" and detect_gpu:
        card = local_gpu()
    limit = config.get("gpu_mem_limit")
    chosen = judged_against(card, limit if isinstance(limit, int) else None)
    count = 1 if config.get("single_process") and accelerator == "cpu" else devices
    why = _planned_for(str(config.get("preset", "")), accelerator, gpus, str(told), gpu_text, "on_cpu" in config)
    return PlanRequest(config=config, devices=count, accelerator=accelerator, gpu=chosen, planned_for=why)


def _planned_for(preset: str, accelerator: str, gpus: int, told: str, gpu_text: str | None, cpu_sizes: bool) -> str:
    """Which machine the plan is for, in words: this one as ``shardtop launch`` runs the preset, or the one asked."""
    what = "GPUs" if accelerator == "cuda" else "CPU processes" + (" with the preset's CPU sizes" if cpu_sizes else "")
    if told != "auto" or gpu_text is not None:
        return f"{what}, as asked ({f'accelerator={told}' if told != 'auto' else f'gpu={gpu_text}'})"
    launch = f"as `shardtop launch {preset}` runs it here" if preset else "as `shardtop launch` runs it here"
    if accelerator == "cuda":
        return f"this machine's {plural(gpus, 'GPU')}, {launch}"
    return f"this machine, which has no GPU: {what}, {launch} (gpu=SIZE or accelerator=cuda plans GPUs)"


def _local_gpus() -> int:
    from shardtop.gpus import gpu_count

    return gpu_count()


def _looks_like_command(word: str) -> bool:
    return word.endswith(".py") or "/" in word or shutil.which(word) is not None


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
