"""The plan of each set-up: its largest micro-batch, its peak at one sample, the bytes a sample adds.

A preset's model is described as ``shardtop plan`` describes it (meta device, one forward traced); a
command is planned as ``shardtop plan -- CMD`` plans it, once as given and once more with activation
checkpointing switched where that is a knob (it changes what the forward saves, so it is traced
again).  A ZeRO stage or an offload changes only the arithmetic (``plan.memory.per_rank``), as a plan's
alternatives do.  Activations scale with the batch; the rest of a rank's memory does not.  A plan that
traced no forward (or saw nothing grow with the batch) gives no batch: its peak would stay under the limit
up to the search's ceiling, which says nothing of where the boundary is.
"""

from __future__ import annotations

import io
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from shardtop.fit.configuration import Configuration
from shardtop.fit.search import MAX_BATCH
from shardtop.plan.cards import Gpu
from shardtop.plan.description import ModelDescription
from shardtop.plan.memory import per_rank
from shardtop.plan.script import ScriptPlan
from shardtop.plan.strategies import Strategy
from shardtop.rundir.engines import ZERO3

RULED_OUT = 1.25
"""A set-up whose planned peak at one sample passes the limit by more than a quarter is not rehearsed: the
plan's worst error against a finished GPU recording is 5.9 % (docs/plan.md), far inside that."""


@dataclass(frozen=True)
class Prediction:
    """What the plan says of one set-up."""

    configuration: Configuration
    strategy: str
    """The plan's words for it (``ZeRO-2, fp32``)."""
    largest_batch: int | None
    """The largest micro-batch whose planned peak is within what the GPU lets PyTorch use; None: not even one."""
    peak_at_one: int
    peak_at_largest: int | None
    slope: float | None
    """Bytes one more sample adds to the planned peak; None where it adds none the plan sees."""
    no_guess: str = ""
    """Why the plan gives no batch though one sample fits it (it traced no forward, or nothing it saw grows
    with the batch); "" where it gives one, or rules out even one."""

    def ruled_out(self, limit: int) -> bool:
        return self.peak_at_one > RULED_OUT * limit


Peak = Callable[[int], int]


def largest_batch(peak: Peak, usable: int, ceiling: int = MAX_BATCH) -> int | None:
    """The largest batch whose ``peak`` is within ``usable``: doubling, then halving the bracket."""
    if peak(1) > usable:
        return None
    low, high = 1, 2
    while high <= ceiling and peak(high) <= usable:
        low, high = high, high * 2
    if high > ceiling:
        return low if peak(ceiling) > usable else ceiling
    while high - low > 1:
        mid = (low + high) // 2
        low, high = (mid, high) if peak(mid) <= usable else (low, mid)
    return low


NOTHING_GROWS = "nothing the plan saw grows with the batch: activations not planned"


def predict(conf: Configuration, desc: ModelDescription, strategy: Strategy, *, devices: int, on_gpu: bool,
            gpu: Gpu, no_forward: str = "") -> Prediction:
    """The set-up's plan; ``no_forward``: what the plan said where it traced no forward ("" where it did)."""
    def peak(batch: int) -> int:
        return per_rank(desc, strategy, devices, gpu=on_gpu, batch_scale=batch / max(1, desc.batch_size)).peak

    wide = max(2, desc.batch_size * 2)
    rise = (peak(wide) - peak(1)) / (wide - 1)
    slope = rise if rise > 0 and not no_forward else None
    no_guess = ""
    if peak(1) <= gpu.usable and slope is None:
        no_guess = f"the plan traced no forward: activations not planned ({no_forward})" if no_forward \
            else NOTHING_GROWS
    largest = None if no_guess else largest_batch(peak, gpu.usable)
    return Prediction(
        configuration=conf, strategy=strategy.label, largest_batch=largest, peak_at_one=peak(1),
        peak_at_largest=peak(largest) if largest is not None else None, slope=slope, no_guess=no_guess,
    )


@dataclass(frozen=True)
class PlannedOnly:
    """A strategy the plan compares that the stack has no knob for: planned, never rehearsed."""

    strategy: str
    largest_batch: int | None


PLANNED_ONLY_SHOWN = 3


def planned_only(plan: TracedPlan, *, devices: int, gpu: Gpu, beyond: int | None) -> list[PlannedOnly]:
    """The plan's alternatives that would take a larger micro-batch than ``beyond`` (the set-up as given's
    planned batch; None: it fits none), the largest first, a few."""
    from shardtop.plan.options import alternatives

    on_gpu = plan.accelerator == "cuda"
    found = []
    for strategy in alternatives(plan.strategy, devices, plan.accelerator)[1:]:
        p = predict(Configuration(as_given=False), plan.description, strategy, devices=devices, on_gpu=on_gpu, gpu=gpu,
                    no_forward=plan.no_forward)
        if p.largest_batch is not None and p.largest_batch > (beyond or 0):
            found.append(PlannedOnly(strategy.label, p.largest_batch))
    found.sort(key=lambda p: -(p.largest_batch or 0))
    return found[:PLANNED_ONLY_SHOWN]


def strategy_for(base: Strategy, conf: Configuration) -> Strategy:
    """The plan's strategy for a set-up: the one as given, at another ZeRO stage or offload."""
    if conf.zero_stage is None:
        return base
    if conf.zero_stage == 0:
        return base.with_(engine="ddp", offload_optimizer=False, offload_params=False, built_whole=False,
                          build_note="")
    return base.with_(engine=f"zero{conf.zero_stage}", offload_optimizer=conf.offload_optimizer,
                      offload_params=conf.offload_params and conf.zero_stage == 3,
                      built_whole=base.built_whole and base.engine == ZERO3 and conf.zero_stage == 3)


@dataclass(frozen=True)
class TracedPlan:
    """What describing the model once told: its description, the strategy as given, where it runs."""

    description: ModelDescription
    strategy: Strategy
    accelerator: str
    no_forward: str = ""
    """What the plan said where it traced no forward (the command's "could not trace" line, the plan's
    note); "" where it traced one."""


def preset_plan(config: Mapping[str, Any], *, devices: int, accelerator: str) -> TracedPlan:
    """A resolved preset's model described, and the strategy its program runs."""
    from shardtop.plan.preset_strategies import PRESET_STRATEGIES
    from shardtop.trace.presets import describe_preset

    desc = describe_preset(config)
    return TracedPlan(desc, PRESET_STRATEGIES[str(config["program"])](config, desc, accelerator, devices), accelerator)


def command_plan(command: Sequence[str], devices: int) -> TracedPlan:
    """``shardtop plan -- CMD`` once; the command's output is kept out of the way (a failure quotes its tail)."""
    from shardtop.plan_command import plan_command

    _, seen = plan_command(list(command), [f"devices={devices}"], err=io.StringIO())
    return TracedPlan(seen.description, seen.strategy, seen.accelerator, no_forward=no_forward_words(seen))


def no_forward_words(seen: ScriptPlan) -> str:
    """What the plan said where it traced no forward: why (a forward it could not trace, a command that ended
    before one, a plan written at the hand-over); "" where it traced one."""
    if seen.complete:
        return ""
    return seen.not_traced or "the plan was written before the model was called"


def predictions(plans: Mapping[bool | None, TracedPlan], confs: Sequence[Configuration], *, devices: int,
                gpu: Gpu) -> list[Prediction]:
    """Each set-up planned from the plan traced with its activation checkpointing (None: not a knob)."""
    out = []
    for conf in confs:
        plan = plans[conf.checkpointing]
        out.append(predict(conf, plan.description, strategy_for(plan.strategy, conf), devices=devices,
                           on_gpu=plan.accelerator == "cuda", gpu=gpu, no_forward=plan.no_forward))
    return out
