"""The ``Strategy`` each preset's program runs, on GPUs and on CPU processes, in the plan's terms.

Engine, units, precision, offload, optimizer, and how the model reaches the
engine, read from a ``ModelDescription`` (torch-free: the launch prompt
replans with these on every key).  How each program builds its model and
runs one batch on the meta device is ``shardtop.trace.recipes``.  The
programs themselves are not imported: they import Lightning (four seconds),
and a plan must be quick.  ``tests/engines/test_plan_presets.py`` checks that
the names copied here (wrapped stacks, halves) match the programs.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from shardtop.config import zero_offload
from shardtop.plan.description import ModelDescription
from shardtop.plan.strategies import (
    ADAMW,
    LIGHTNING_ZERO,
    SGD_MOMENTUM,
    Strategy,
    ZeroSettings,
)

HAND_WRAPPED = ("transformers1", "transformer_0", "transformer_1", "transformers_out")
"""``fsdp_story.HAND_WRAPPED``: the stacks story 1 wraps by hand."""
FIRST_HALF = ("conv1", "bn1", "relu", "transformers1", "conv2", "bn2", "transformer_0")
SECOND_HALF = ("transformer_1", "transformers_out", "conv_out", "out_layer")
"""``manual_placement.FIRST_HALF`` / ``SECOND_HALF``."""

AskedStrategy = Callable[[Mapping[str, Any], ModelDescription, str, int], Strategy]
"""(config, description, accelerator, devices) -> the strategy the program runs."""


def _rows(desc: ModelDescription, paths: tuple[str, ...]) -> tuple[int, ...]:
    return tuple(r for r in (desc.row_of(p) for p in paths) if r is not None)


def _rows_of_type(desc: ModelDescription, type_name: str) -> tuple[int, ...]:
    return tuple(r for r, t in enumerate(desc.types) if t == type_name)


def _zero3(fixed: bool) -> AskedStrategy:
    def asked(config: Mapping[str, Any], desc: ModelDescription, accelerator: str, devices: int) -> Strategy:
        lightning = accelerator == "cuda"
        note = ("layers built in configure_model(), inside deepspeed.zero.Init" if fixed else
                "layers built in __init__, outside deepspeed.zero.Init: DeepSpeed moves the whole model "
                "to each device before partitioning it")
        offload = zero_offload(config)
        if offload.any and not lightning:
            note += "; offload to CPU asked, but on CPU processes what it moves stays in the rank's memory"
        return Strategy(
            engine="zero3", optimizer=ADAMW, built_whole=not fixed, build_note=note,
            driver="lightning" if lightning else "loop", zero=LIGHTNING_ZERO if lightning else ZeroSettings(),
            offload_optimizer=offload.optimizer != "none", offload_params=offload.param != "none",
        )

    return asked


def _fsdp2_mlp(config: Mapping[str, Any], desc: ModelDescription, accelerator: str, devices: int) -> Strategy:
    return Strategy(engine="fsdp2", sharding="FULL_SHARD", units=_rows_of_type(desc, "Block"), root_wrapped=True,
                    optimizer=ADAMW, driver="lightning")


def _fsdp_not_sharding(config: Mapping[str, Any], desc: ModelDescription, accelerator: str, devices: int) -> Strategy:
    gpu = accelerator == "cuda"
    return Strategy(
        engine="fsdp1", sharding="FULL_SHARD", precision="fp16-mixed", half_in_units_only=True,
        units=_rows(desc, HAND_WRAPPED), root_wrapped=False, offload_params=gpu, optimizer=SGD_MOMENTUM,
        driver="lightning" if gpu else "loop",
        build_note="four stacks wrapped by hand in configure_sharded_model; the root is not wrapped, so every "
                   "other layer stays whole on each rank",
    )


def _fsdp_auto_wrap(config: Mapping[str, Any], desc: ModelDescription, accelerator: str, devices: int) -> Strategy:
    gpu = accelerator == "cuda"
    return Strategy(
        engine="fsdp1", sharding="FULL_SHARD", precision="fp16-mixed" if gpu else "fp32",
        units=_rows_of_type(desc, "TransformerBlock"), root_wrapped=True, optimizer=SGD_MOMENTUM,
        driver="lightning" if gpu else "loop",
    )


def _ddp(config: Mapping[str, Any], desc: ModelDescription, accelerator: str, devices: int) -> Strategy:
    return Strategy(engine="ddp", optimizer=SGD_MOMENTUM, driver="lightning")


def _manual(config: Mapping[str, Any], desc: ModelDescription, accelerator: str, devices: int) -> Strategy:
    if accelerator != "cuda":
        first = second = "cpu"
    elif devices >= 2:
        first, second = "cuda:0", "cuda:1"
    else:
        first, second = "cuda:0", "cpu"
    return Strategy(engine="manual", optimizer=SGD_MOMENTUM,
                    placement=((first, _rows(desc, FIRST_HALF)), (second, _rows(desc, SECOND_HALF))),
                    build_note=f"first half on {first}, second half on {second}, in one process")


PRESET_STRATEGIES: dict[str, AskedStrategy] = {
    "zero3-linear": _zero3(fixed=False),
    "zero3-linear-fixed": _zero3(fixed=True),
    "fsdp2-mlp": _fsdp2_mlp,
    "fsdp-not-sharding": _fsdp_not_sharding,
    "fsdp-auto-wrap": _fsdp_auto_wrap,
    "ddp-baseline": _ddp,
    "manual-placement": _manual,
}
"""By preset ``program``: the programs a preset can plan."""
