"""``shardtop plan [devices=N] [gpu=SIZE|CARD] -- CMD ARGS…``: plan the user's own script.

The command runs as under ``shardtop run`` (the bootstrap first on its
``PYTHONPATH``, in every Python process it starts), with the bootstrap in
plan-only mode (``shardtop.inject.plan_only``): the engines' entry points
hand the model back unwrapped, and the first forward call of the model is
traced on a meta-device copy at the shapes of the batch the script passes.
Rank 0 then writes what it saw (a ``ScriptPlan``: the model's description,
the strategy the script asked for, the devices) and every rank leaves with
exit code 0 before any training step.  Here the plan is made and rendered as
for a preset.  Torch-free: the command's ranks do the torch work.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

import msgspec

from shardtop.config import ConfigError
from shardtop.plan.cards import Gpu, UnknownGpu, local_gpu, parse_gpu
from shardtop.plan.compare import Plan, make_plan
from shardtop.plan.description import ModelDescription
from shardtop.plan.render import PlanFormat
from shardtop.plan.strategies import Strategy

PLAN_FILE = "plan-rank-0.json"
OUTPUT_TAIL = 15
"""Lines of the command's output repeated when it ended without a plan."""


class ScriptPlan(msgspec.Struct, frozen=True, kw_only=True):
    """What rank 0 of the user's command saw, for the plan: written as JSON into the plan directory."""

    description: ModelDescription
    strategy: Strategy
    devices: int
    """The command's world size."""
    accelerator: str
    """cuda or cpu: where the batch (else the model) was."""
    entry: str
    """The engine entry point that got the model, e.g. ``deepspeed.initialize``; "" for a plain loop."""
    notes: list[str] = []
    """What the plan could not see, in words."""
    complete: bool = True
    """False: written at the hand-over, before a batch was seen (no activations yet)."""


def write_script_plan(directory: Path, plan: ScriptPlan) -> None:
    tmp = directory / f".{PLAN_FILE}.{os.getpid()}.tmp"
    tmp.write_bytes(msgspec.json.encode(plan))
    os.replace(tmp, directory / PLAN_FILE)


def read_script_plan(directory: Path) -> ScriptPlan | None:
    try:
        return msgspec.json.decode((directory / PLAN_FILE).read_bytes(), type=ScriptPlan)
    except (OSError, msgspec.DecodeError):
        return None


def _options(settings: Sequence[str]) -> tuple[int | None, str | None]:
    """``devices=N`` and ``gpu=…`` before ``--``; anything else is refused with what to type."""
    from shardtop.plan.command import devices_setting

    devices: int | None = None
    gpu: str | None = None
    for word in settings:
        key, sep, value = word.partition("=")
        if sep and key == "devices":
            devices = devices_setting(value)
        elif sep and key == "gpu":
            gpu = value
        else:
            raise ConfigError(
                f"{word!r}: planning your own command takes only devices=N and gpu=SIZE|CARD before --, "
                "e.g. shardtop plan gpu=A100-80GB -- torchrun --nproc_per_node 8 train.py"
            )
    return devices, gpu


def run_script_plan(command: Sequence[str], settings: Sequence[str], output_format: PlanFormat) -> str:
    """What ``shardtop plan -- CMD`` prints."""
    plan, _ = plan_command(command, settings)
    if output_format == "json":
        from shardtop.plan.json_plan import render_json

        return render_json(plan)
    from shardtop.plan.render import render_markdown, render_text

    return render_markdown(plan) if output_format == "markdown" else render_text(plan)


def plan_command(
    command: Sequence[str], settings: Sequence[str], *, err: TextIO | None = None
) -> tuple[Plan, ScriptPlan]:
    """Run ``command`` in plan-only mode and plan what its rank 0 saw; ``ConfigError`` says why not."""
    from shardtop.inject import plan_env

    if not command:
        raise ConfigError("shardtop plan -- needs your command after --, e.g. shardtop plan -- python train.py")
    devices, gpu_text = _options(settings)
    try:
        chosen = parse_gpu(gpu_text) if gpu_text is not None else None
    except UnknownGpu as e:
        raise ConfigError(str(e)) from None
    if shutil.which(command[0]) is None:
        where = "is not a file" if os.sep in command[0] else "is not on PATH"
        raise ConfigError(f"cannot run {command[0]!r}: it {where}. Check the command after --, or give its full path.")
    directory = Path(tempfile.mkdtemp(prefix="shardtop-plan-"))
    try:
        output = _run(list(command), plan_env(os.environ, directory), err)
        seen = read_script_plan(directory)
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    if seen is None:
        tail = "\n".join(f"  {line}" for line in output.code_and_tail())
        raise ConfigError(
            f"the command ended (exit {output.code}) before a rank handed a model to an engine "
            "(deepspeed.initialize, FullyShardedDataParallel, fully_shard, DistributedDataParallel) or called "
            f"one: nothing to plan.\n{tail}"
        )
    accelerator = seen.accelerator
    gpu: Gpu | None = chosen if chosen is not None else (local_gpu() if accelerator == "cuda" else None)
    notes = tuple(seen.notes)
    plan = make_plan(
        seen.description, seen.strategy, devices=devices or seen.devices, gpu=gpu, accelerator=accelerator,
        command=shlex.join(command), notes=notes,
    )
    return plan, seen


@dataclass(frozen=True)
class _Output:
    code: int
    lines: list[str]
    """The last lines the command printed."""

    def code_and_tail(self) -> list[str]:
        return self.lines[-OUTPUT_TAIL:] or ["(it printed nothing)"]


def _run(command: list[str], env: dict[str, str], err: TextIO | None) -> _Output:
    """The command, its output passed on to stderr as it comes (stdout stays the plan's), the tail kept."""
    stream = err if err is not None else sys.stderr
    proc = subprocess.Popen(command, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT)
    assert proc.stdout is not None
    lines: list[str] = []
    for raw in proc.stdout:
        line = raw.decode(errors="replace")
        stream.write(line)
        lines.append(line.rstrip("\n"))
        del lines[:-OUTPUT_TAIL]
    stream.flush()
    return _Output(proc.wait(), lines)
