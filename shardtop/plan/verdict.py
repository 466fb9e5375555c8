"""Fits or not, what dominates, and the cheapest change that makes it fit.  Torch-free."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from shardtop.plan.cards import Gpu
from shardtop.plan.memory import PerRank
from shardtop.plan.options import change_cost
from shardtop.plan.strategies import Strategy
from shardtop.plan.zero import WHOLE
from shardtop.rundir.events import TIMELINE, when
from shardtop.units import format_bytes

MAX_DEVICES = 4096


@dataclass(frozen=True)
class Option:
    """One strategy's plan: bytes per rank, whether that fits the GPU, and why it peaks where it does."""

    strategy: Strategy
    per_rank: PerRank
    fits: bool | None
    """None when no GPU was given to judge against."""
    runs_out_at: str | None
    """The first phase that does not fit (a run fails there, whatever comes later)."""
    dominant: str
    """What is largest where it runs out, or at the peak when it fits, in words."""
    dominant_bytes: int

    @property
    def note(self) -> str:
        where = f"out of memory {when(self.runs_out_at)}" if self.runs_out_at else f"peak at {self.per_rank.peak_phase}"
        return f"{where}: {self.dominant} ({format_bytes(self.dominant_bytes)})"


@dataclass(frozen=True)
class Verdict:
    fits: bool | None
    change: Option | None
    """The fitting option that costs the user least to switch to (None if the asked one fits or none does)."""
    batch_size: int | None
    """The largest batch at which the asked strategy fits, when a smaller batch is enough."""
    devices: int | None
    """The fewest devices on which the asked strategy fits, when more devices are enough."""


def fits(per_rank: PerRank, gpu: Gpu | None) -> bool | None:
    return None if gpu is None else per_rank.peak <= gpu.usable


def runs_out_at(per_rank: PerRank, gpu: Gpu | None) -> str | None:
    """The first phase, in the order a run meets them, whose peak is over what the GPU allows."""
    if gpu is None:
        return None
    return next((phase for phase, size in zip(TIMELINE, per_rank.timeline, strict=True) if size > gpu.usable), None)


def dominant(s: Strategy, p: PerRank, phase: str, gpu: Gpu | None = None) -> tuple[str, int]:
    """The largest part of a phase's peak, named for the user; at set-up, the request that does not fit
    ``gpu`` where the engine's own buffers decide it."""
    if phase == "set-up":
        request = p.setup_request(gpu.usable if gpu is not None else None)
        if s.built_whole and request is not None and request[0] == WHOLE:  # the first request: the model itself
            return "the whole model as built, on every rank before the engine splits it", request[1]
        if request is not None:
            return f"the engine's set-up, up to {request[0]}", request[1]
        if s.built_whole:
            return "building the whole model on every rank and handing it to the engine", p.setup
        return "building the model and handing it to the engine", p.setup
    parts = {
        "parameters": p.params,
        "optimizer state": p.optimizer,
        "gradients": p.grads,
        "engine buffers": p.buffers,
    }
    if phase.endswith(("forward", "backward")):
        parts["activations"] = p.activations
        parts["gathered parameters"] = p.gathered
        if phase.endswith("backward"):
            parts["whole gradients of the unit being reduced"] = p.unit_grads
    else:
        parts["the step's temporary copies"] = p.step_temporary
    return max(parts.items(), key=lambda kv: kv[1])


def option(s: Strategy, p: PerRank, gpu: Gpu | None) -> Option:
    out_at = runs_out_at(p, gpu)
    words, size = dominant(s, p, out_at or p.peak_phase, gpu)
    return Option(strategy=s, per_rank=p, fits=fits(p, gpu), runs_out_at=out_at, dominant=words, dominant_bytes=size)


def judge(
    options: Sequence[Option],
    gpu: Gpu | None,
    devices: int,
    batch_size: int,
    replan: Callable[[int, float], PerRank],
) -> Verdict:
    """The verdict on ``options[0]`` (the asked strategy).

    ``replan(devices, batch_scale)`` plans the asked strategy again on other
    devices or at a fraction of the batch, for the two changes that need no
    other strategy.
    """
    asked = options[0]
    if gpu is None or asked.fits:
        return Verdict(fits=asked.fits, change=None, batch_size=None, devices=None)
    fitting = [o for o in options[1:] if o.fits]
    change = min(fitting, key=lambda o: (change_cost(asked.strategy, o.strategy), o.per_rank.peak), default=None)
    return Verdict(
        fits=False,
        change=change,
        batch_size=_batch_that_fits(replan, devices, batch_size, gpu),
        devices=_devices_that_fit(replan, devices, gpu),
    )


def _batch_that_fits(replan: Callable[[int, float], PerRank], devices: int, batch: int, gpu: Gpu) -> int | None:
    if batch <= 1 or replan(devices, 1 / batch).peak > gpu.usable:
        return None
    low, high = 1, batch
    while high - low > 1:
        mid = (low + high) // 2
        if replan(devices, mid / batch).peak <= gpu.usable:
            low = mid
        else:
            high = mid
    return low


def _devices_that_fit(replan: Callable[[int, float], PerRank], devices: int, gpu: Gpu) -> int | None:
    """The fewest devices above ``devices`` that fit, if the strategy shards enough for that."""
    if replan(MAX_DEVICES, 1.0).peak > gpu.usable:
        return None
    low, high = devices, MAX_DEVICES
    while high - low > 1:
        mid = (low + high) // 2
        if replan(mid, 1.0).peak <= gpu.usable:
            high = mid
        else:
            low = mid
    return high
