"""What the user's own command saw, for ``shardtop plan -- CMD``: the record its rank 0 writes.

The command runs in plan-only mode (``shardtop.plan_command``, with the
bootstrap's ``shardtop.inject.plan_only``): the first forward call of the
model is traced on a meta-device copy, and rank 0 writes what it saw (a
``ScriptPlan``: the model's description, the strategy the script asked for,
the devices) into the plan directory before every rank leaves.  The parent
reads it back here.  Torch-free: the command's ranks do the torch work.
"""

from __future__ import annotations

import os
from pathlib import Path

import msgspec

from shardtop.plan.description import ModelDescription
from shardtop.plan.strategies import Strategy

PLAN_FILE = "plan-rank-0.json"


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
    not_traced: str = ""
    """Why no forward was traced, in words: a first forward that could not be traced, a command that ended
    before calling its model, a plan written at the hand-over; "" where one was."""


def write_script_plan(directory: Path, plan: ScriptPlan) -> None:
    tmp = directory / f".{PLAN_FILE}.{os.getpid()}.tmp"
    tmp.write_bytes(msgspec.json.encode(plan))
    os.replace(tmp, directory / PLAN_FILE)


def read_script_plan(directory: Path) -> ScriptPlan | None:
    try:
        return msgspec.json.decode((directory / PLAN_FILE).read_bytes(), type=ScriptPlan)
    except (OSError, msgspec.DecodeError):
        return None
