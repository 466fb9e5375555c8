"""``shardtop plan``: a preset's plan, or the plan of the user's own command (``shardtop plan -- CMD``), rendered.

A preset's model is built and traced on the meta device here
(``shardtop.trace``).  The user's command runs as under ``shardtop run`` (the
bootstrap first on its ``PYTHONPATH``, in every Python process it starts),
with the bootstrap in plan-only mode (``shardtop.inject.plan_only``): the
engines' entry points hand the model back unwrapped, and the first forward
call of the model is traced on a meta-device copy at the shapes of the batch
the script passes.  Rank 0 then writes what it saw (``shardtop.plan.script``)
and every rank leaves with exit code 0 before any training step.  Here the
plan is made and rendered as for a preset.  Torch-free for a command: its
ranks do the torch work.

Above ``plan/`` (arithmetic), ``trace/`` (the model traced) and ``inject/``
(the bootstrap), which is why it is none of them.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TextIO

from shardtop.config import ConfigError
from shardtop.plan.cards import Gpu, UnknownGpu, local_gpu, parse_gpu
from shardtop.plan.command import devices_setting, read_request
from shardtop.plan.compare import Plan, make_plan
from shardtop.plan.render import PlanFormat
from shardtop.plan.script import ScriptPlan, read_script_plan

OUTPUT_TAIL = 15
"""Lines of the command's output repeated when it ended without a plan."""
ERROR_LINE = re.compile(r"^\s*(?:[A-Za-z_][\w.]*\.)?[A-Za-z_]\w*(?:Error|Exception|Exit): \S")
"""A Python exception as a traceback ends (``ValueError: …``), for a launcher whose own summary comes after it."""


def run_plan(settings: Sequence[str], output_format: PlanFormat) -> str:
    """The plan, rendered: what ``shardtop plan`` prints."""
    from shardtop.trace.presets import plan_config

    request = read_request(settings)
    plan = replace(
        plan_config(request.config, devices=request.devices, accelerator=request.accelerator, gpu=request.gpu),
        planned_for=request.planned_for,
    )
    if output_format == "json":
        from shardtop.plan.json_plan import render_json

        return render_json(plan)
    from shardtop.plan.render import render_markdown, render_text

    return render_markdown(plan) if output_format == "markdown" else render_text(plan)


def _options(settings: Sequence[str]) -> tuple[int | None, str | None]:
    """``devices=N`` and ``gpu=…`` before ``--``; anything else is refused with what to type."""
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
        if output.error is not None and output.error not in output.code_and_tail():
            tail += f"\nThe last error it printed:\n  {output.error.strip()}"
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
    error: str | None = None
    """The last line that named a Python exception (``ValueError: …``), however early."""

    def code_and_tail(self) -> list[str]:
        return self.lines[-OUTPUT_TAIL:] or ["(it printed nothing)"]


def _run(command: list[str], env: dict[str, str], err: TextIO | None) -> _Output:
    """The command, its output passed on to stderr as it comes (stdout stays the plan's), the tail kept."""
    stream = err if err is not None else sys.stderr
    proc = subprocess.Popen(command, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT)
    assert proc.stdout is not None
    lines: list[str] = []
    error: str | None = None
    for raw in proc.stdout:
        line = raw.decode(errors="replace")
        stream.write(line)
        lines.append(line.rstrip("\n"))
        del lines[:-OUTPUT_TAIL]
        if ERROR_LINE.match(line):
            error = line.rstrip("\n")
    stream.flush()
    return _Output(proc.wait(), lines, error)
