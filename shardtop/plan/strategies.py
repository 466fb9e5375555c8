"""The strategies a plan compares, in the engines' own terms.

A ``Strategy`` says what the engine does with the model: how parameters,
gradients and optimizer state are split over ranks, what is offloaded, which
precision computes, which modules are FSDP units, how the model reached the
device (whole, or partitioned as it was built), and who drives the loop.
``memory.py`` turns a strategy and a ``ModelDescription`` into bytes per rank.
Torch-free.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field, replace
from typing import Final

from shardtop.rundir.engines import DDP, FSDP1, FSDP2, FSDP_ENGINES, MANUAL, ZERO1, ZERO2, ZERO3, ZERO_ENGINES

SINGLE: Final = "single"
"""The plan's one device: no engine, no data parallelism (a run's ``plain``)."""
ENGINES = (SINGLE, DDP, ZERO1, ZERO2, ZERO3, FSDP1, FSDP2, MANUAL)
"""The engines a plan compares (``rundir/engines.py`` spells them)."""
FSDP_SHARDING = ("FULL_SHARD", "SHARD_GRAD_OP", "HYBRID_SHARD", "NO_SHARD")
PRECISIONS = ("fp32", "bf16-mixed", "fp16-mixed")


@dataclass(frozen=True)
class Optimizer:
    """The optimizer's state per parameter element, in fp32, and its step's temporaries."""

    name: str
    state_bytes: int
    """AdamW: exp_avg + exp_avg_sq, 8; SGD with momentum: 4; plain SGD: 0."""
    step_temporary: float
    """Extra copies of the parameters one step allocates (foreach AdamW: sqrt(exp_avg_sq), 1)."""


ADAMW = Optimizer("AdamW", 8, 1.0)
SGD_MOMENTUM = Optimizer("SGD (momentum)", 4, 0.0)


@dataclass(frozen=True)
class ZeroSettings:
    """The DeepSpeed settings that size ZeRO's own buffers (elements, not bytes)."""

    reduce_bucket_size: int = 500_000_000
    overlap_comm: bool | None = None
    """None: DeepSpeed's default, on for stage 3 only."""
    prefetch_bucket_size: int = 50_000_000
    param_persistence_threshold: int = 100_000
    model_persistence_threshold: int = sys.maxsize
    """ZeRO-3 keeps parameters of at most ``param_persistence_threshold`` elements whole while their sum is
    within this."""
    max_live_parameters: int = 1_000_000_000
    """ZeRO-3 prefetches until this many elements are whole, and keeps them for their next use."""
    sub_group_size: int = 1_000_000_000
    """ZeRO-3 updates its partition in sub-groups of this many elements: the step's fp32 copies are one's size."""
    contiguous_gradients: bool = True
    """Gradients are copied into the reduce bucket, a buffer of ``reduce_bucket_size`` elements."""


LIGHTNING_ZERO = ZeroSettings(reduce_bucket_size=200_000_000, overlap_comm=True, sub_group_size=1_000_000_000_000)
"""What Lightning's ``DeepSpeedStrategy`` passes to DeepSpeed."""


@dataclass(frozen=True)
class Strategy:
    """One way to run the model; ``label`` is the name users read and JSON's ``strategy``."""

    engine: str
    sharding: str = ""
    """FSDP only: FULL_SHARD, SHARD_GRAD_OP, HYBRID_SHARD or NO_SHARD."""
    precision: str = "fp32"
    half_in_units_only: bool = False
    """FSDP ``MixedPrecision`` without autocast: only the units compute in half precision."""
    offload_params: bool = False
    offload_optimizer: bool = False
    units: tuple[int, ...] = ()
    """FSDP units (tree rows); parameters in none of them are held whole on each rank."""
    root_wrapped: bool = True
    kept_whole: tuple[int, ...] = ()
    """FSDP2: units asked to keep their parameters whole from forward to their backward
    (``reshard_after_forward=False`` on those units only, as accelerate asks it of the last norm and head)."""
    built_whole: bool = False
    """The whole model was on the device before the engine split it (e.g. ZeRO-3 outside ``zero.Init``)."""
    optimizer: Optimizer = ADAMW
    driver: str = "loop"
    """lightning (its loop clears gradients after ``training_step``, so last step's are alive
    during forward) or loop (a plain loop that clears them right after the step)."""
    zero: ZeroSettings = field(default_factory=ZeroSettings)
    placement: tuple[tuple[str, tuple[int, ...]], ...] = ()
    """manual: (device, rows) per part of the model."""
    node_size: int = 8
    """GPUs per node: HYBRID_SHARD shards within a node and replicates across nodes."""
    build_note: str = ""
    """How the model is built, in words, when it matters (shown with the asked strategy)."""

    @property
    def label(self) -> str:
        name = {
            SINGLE: "one device",
            DDP: "DDP",
            ZERO1: "ZeRO-1",
            ZERO2: "ZeRO-2",
            ZERO3: "ZeRO-3",
            FSDP1: f"FSDP {self.sharding or 'FULL_SHARD'}",
            FSDP2: "FSDP2" + (" (no reshard after forward)" if self.sharding == "SHARD_GRAD_OP" else ""),
            MANUAL: "manual placement",
        }[self.engine]
        extras = [self.precision]
        if self.offload_params and self.offload_optimizer and self.engine in ZERO_ENGINES:
            extras.append("param + optimizer offload")
        elif self.offload_params:
            extras.append("CPU offload" if self.engine in FSDP_ENGINES else "param offload")
        elif self.offload_optimizer:
            extras.append("optimizer offload")
        if self.half_in_units_only and self.precision != "fp32":
            extras.append("half precision in units only")
        if self.built_whole and self.engine != DDP:
            extras.append("model built whole first")
        return f"{name}, {', '.join(extras)}"

    @property
    def grads_kept_through_forward(self) -> bool:
        return self.driver == "lightning"

    @property
    def half(self) -> bool:
        """Half-precision copies of fp32 parameters (mixed precision); "-true" precisions have none: the
        parameters themselves are half precision, and so is the optimizer's state."""
        return self.precision not in ("fp32", "bf16-true", "fp16-true")

    @property
    def autocast(self) -> bool:
        """The forward runs under ``torch.autocast`` (Lightning's, accelerate's "-mixed"): each op in its own
        dtype.  DeepSpeed's fp16 and bf16 make the model itself half precision instead, and FSDP's
        ``MixedPrecision`` alone casts only inside its units."""
        return self.half and not self.half_in_units_only and self.engine not in ZERO_ENGINES

    @property
    def true_half(self) -> bool:
        return self.precision in ("bf16-true", "fp16-true")

    def with_(self, **changes: object) -> Strategy:
        return replace(self, **changes)  # type: ignore[arg-type]
