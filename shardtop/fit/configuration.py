"""A set-up fit tries, apart from the micro-batch, and the knobs a stack exposes to change it.  Pure.

A ``Knob`` is one thing fit may change (the micro-batch, activation checkpointing, ZeRO's stage and
offload, the CUDA allocator's segments), found where the user's stack exposes it without an edit to the
script, or said not to be, with why.  A ``Configuration`` is one combination of the knobs' settings;
the one as given is always among them.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Literal

KnobKind = Literal["micro-batch", "steps", "activation checkpointing", "sharding", "offload", "allocator"]
KNOB_KINDS: tuple[KnobKind, ...] = (
    "micro-batch", "steps", "activation checkpointing", "sharding", "offload", "allocator",
)
EXPANDABLE = "expandable_segments:True"
"""``PYTORCH_CUDA_ALLOC_CONF``'s setting that lets the CUDA allocator grow segments instead of cutting new ones."""


@dataclass(frozen=True)
class Knob:
    """One knob of the stack: where fit sets it, or why it cannot."""

    kind: KnobKind
    found: bool
    where: str
    """Where fit sets it (``batch_size=``, ``--per_device_train_batch_size``, ``ds.json``), or why not."""


@dataclass(frozen=True)
class Configuration:
    """One set-up: the knobs' settings besides the micro-batch.  ``None``: the stack has no such knob."""

    zero_stage: int | None = None
    offload_optimizer: bool = False
    offload_params: bool = False
    """ZeRO-3's parameter offload (with the optimizer's)."""
    checkpointing: bool | None = None
    expandable_segments: bool = False
    as_given: bool = True
    """The set-up the stack is in as the user gave it."""
    given: str = ""
    """The set-up as given, in the plan's words (``ZeRO-3, fp32``), shown beside ``as given``."""

    @property
    def label(self) -> str:
        """The set-up in a user's words: ``as given (ZeRO-3, fp32)``, ``ZeRO-2, activation checkpointing``."""
        sharding: list[str] = []
        if self.zero_stage is not None:
            sharding.append(f"ZeRO-{self.zero_stage}")
        if self.offload_params:
            sharding.append("param + optimizer offload")
        elif self.offload_optimizer:
            sharding.append("optimizer offload")
        rest: list[str] = []
        if self.checkpointing is not None:
            rest.append("activation checkpointing" if self.checkpointing else "no activation checkpointing")
        if self.expandable_segments:
            rest.append("expandable segments")
        if self.as_given:  # the plan's words for the strategy say its sharding and offload already
            shown = ", ".join([self.given] if self.given else sharding) + "".join(f", {p}" for p in rest)
            return f"as given ({shown.lstrip(', ')})" if shown else "as given"
        return ", ".join(sharding + rest)

    @property
    def offload_level(self) -> int:
        """0: nothing offloaded; 1: the optimizer's state; 2: the parameters too (slowest)."""
        return 2 if self.offload_params else 1 if self.offload_optimizer else 0

    def but(self, **changes: object) -> Configuration:
        """This set-up with ``changes``, no longer the one as given."""
        return replace(self, as_given=False, **changes)  # type: ignore[arg-type]
