"""The engines' names: how the ranks hold the model, as the probe writes it and every reader compares it.

The one place these words are spelt.  An event keeps the word its writer chose
(``Hello.engine`` is text: an older or newer writer may know an engine this
one does not); code that asks which engine a run has compares with the names
and families below.  No torch here, and nothing else of shardtop.
"""

from __future__ import annotations

from typing import Final, Literal

Engine = Literal["fsdp1", "fsdp2", "zero1", "zero2", "zero3", "ddp", "manual", "plain"]
"""FSDP (``FullyShardedDataParallel``, or FSDP2's ``fully_shard``), DeepSpeed ZeRO stage 1, 2 or 3, DDP,
modules placed on devices by hand, or none of them (the model as it is)."""

FSDP1: Final = "fsdp1"
FSDP2: Final = "fsdp2"
ZERO1: Final = "zero1"
ZERO2: Final = "zero2"
ZERO3: Final = "zero3"
DDP: Final = "ddp"
MANUAL: Final = "manual"
PLAIN: Final = "plain"
DEEPSPEED: Final = "deepspeed"
"""What a launcher asked for when it named DeepSpeed without its stage (``Hello.asked_engine``)."""

FSDP_ENGINES: Final = frozenset({FSDP1, FSDP2})
ZERO_ENGINES: Final = frozenset({ZERO1, ZERO2, ZERO3})
SHARDED_ENGINES: Final = frozenset({FSDP1, FSDP2, ZERO3})
"""Engines that split parameters across ranks."""
OPTIMIZER_SHARDING_ENGINES: Final = ZERO_ENGINES | FSDP_ENGINES
"""Engines that partition optimizer state across the data-parallel ranks."""
WHOLE_MODEL_ENGINES: Final = frozenset({DDP, PLAIN})
"""Engines that leave every rank the whole model."""


def family(engine: str) -> str:
    """``fsdp`` for FSDP1 and FSDP2, ``zero`` for any ZeRO stage (or DeepSpeed asked for without one), else
    the engine itself: FSDP asked for and FSDP2 run is what was asked."""
    if engine in FSDP_ENGINES:
        return "fsdp"
    if engine in ZERO_ENGINES or engine == DEEPSPEED:
        return "zero"
    return engine
