"""The strategy a user's script asked for, from what its engine entry point was given.

``shardtop plan -- CMD`` sees the script hand its model to an engine:
``deepspeed.initialize`` with a config, ``FullyShardedDataParallel`` with its
keyword arguments, ``fully_shard`` per module, ``DistributedDataParallel``,
or none (a plain loop).  ``Asked`` holds those facts as plain values (the
rank turns torch objects into names and numbers); ``strategy_of`` says it
in the plan's terms, with a note for each thing it had to assume.
Torch-free.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from shardtop.plan.strategies import (
    ADAMW,
    SGD_MOMENTUM,
    SINGLE,
    Optimizer,
    Strategy,
    ZeroSettings,
)
from shardtop.rundir.engines import DDP, FSDP_ENGINES, ZERO_ENGINES

BUILT_WHOLE_NOTE = ("built outside deepspeed.zero.Init: DeepSpeed moves the whole model to each device before "
                    "partitioning it")


@dataclass(frozen=True)
class Asked:
    """What the script handed its engine, as plain values."""

    engine: str = SINGLE
    """zero1, zero2, zero3, fsdp1, fsdp2, ddp or single."""
    entry: str = ""
    deepspeed: Mapping[str, Any] = field(default_factory=dict)
    """The DeepSpeed config as given (a dict)."""
    partitioned: bool = False
    """The parameters were already ZeRO-3 partitions (built under ``deepspeed.zero.Init``)."""
    on_device: bool = False
    """The whole model was on the accelerator the run uses when the engine got it."""
    sharding: str = ""
    """FSDP1's ``sharding_strategy`` by name; FSDP2: ``SHARD_GRAD_OP`` for ``reshard_after_forward=False``."""
    offload_params: bool = False
    half: str = ""
    """FSDP's mixed precision: ``fp16-mixed`` or ``bf16-mixed`` from its ``param_dtype``."""
    units: tuple[int, ...] = ()
    """Rows of the modules the engine makes units (by hand or by policy), the root's row 0 included if wrapped."""
    kept_whole: tuple[int, ...] = ()
    """FSDP2: rows of the units besides the root asked to keep their parameters whole after forward."""
    policy_unknown: str = ""
    """An auto-wrap policy shardtop cannot read, by name."""
    mesh_dims: int = 1
    optimizer: str = ""
    """The optimizer's class name ("" if none was made by the first forward)."""
    momentum: float = 0.0
    trainer_precision: str = ""
    """Lightning's ``Trainer(precision=...)`` as given; "" without a Trainer."""


def _optimizer(name: str, momentum: float) -> tuple[Optimizer, str]:
    key = name.lower()
    if not name:
        return ADAMW, "no optimizer existed by the first forward: planned with AdamW's state (8 bytes per parameter)"
    if key in ("adam", "adamw", "fusedadam", "deepspeedcpuadam", "fusedlamb", "lamb"):
        return ADAMW, ""
    if key == "sgd":
        return (SGD_MOMENTUM if momentum else Optimizer("SGD", 0, 0.0)), ""
    if key in ("adagrad", "rmsprop"):
        return Optimizer(name, 4, 0.0), ""
    return ADAMW, f"{name} is not an optimizer the plan knows: planned with AdamW's state (8 bytes per parameter)"


def _precision(trainer: str) -> str:
    text = trainer.strip().lower()
    true = text.endswith("-true")
    if text.startswith(("16", "fp16")):
        return "fp16-true" if true else "fp16-mixed"
    if text.startswith("bf16"):
        return "bf16-true" if true else "bf16-mixed"
    return "fp32"


def _number(value: Any, default: int) -> int:
    return int(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else default


def _enabled(section: Any) -> bool:
    return isinstance(section, Mapping) and section.get("enabled") is True


def _offloaded(section: Any) -> bool:
    return isinstance(section, Mapping) and section.get("device") in ("cpu", "nvme")


def _zero(a: Asked, optimizer: Optimizer, driver: str) -> tuple[Strategy, list[str]]:
    config = a.deepspeed
    zero = config.get("zero_optimization") or {}
    zero = zero if isinstance(zero, Mapping) else {}
    stage = int(a.engine[-1])
    precision = (
        "bf16-mixed" if _enabled(config.get("bf16")) else "fp16-mixed" if _enabled(config.get("fp16")) else "fp32"
    )
    defaults = ZeroSettings()
    overlap = zero.get("overlap_comm")
    settings = ZeroSettings(
        reduce_bucket_size=_number(zero.get("reduce_bucket_size"), defaults.reduce_bucket_size),
        overlap_comm=overlap if isinstance(overlap, bool) else None,
        prefetch_bucket_size=_number(zero.get("stage3_prefetch_bucket_size"), defaults.prefetch_bucket_size),
        param_persistence_threshold=_number(zero.get("stage3_param_persistence_threshold"),
                                            defaults.param_persistence_threshold),
        model_persistence_threshold=_number(zero.get("stage3_model_persistence_threshold"),
                                            defaults.model_persistence_threshold),
        max_live_parameters=_number(zero.get("stage3_max_live_parameters"), defaults.max_live_parameters),
        sub_group_size=_number(zero.get("sub_group_size"), defaults.sub_group_size),
        contiguous_gradients=zero.get("contiguous_gradients") is not False,
    )
    built_whole = stage == 3 and not a.partitioned
    note = BUILT_WHOLE_NOTE if built_whole else "built inside deepspeed.zero.Init" if stage == 3 else ""
    strategy = Strategy(
        engine=a.engine, precision=precision, optimizer=optimizer, driver=driver, zero=settings,
        offload_optimizer=_offloaded(zero.get("offload_optimizer")),
        offload_params=stage == 3 and _offloaded(zero.get("offload_param")),
        built_whole=built_whole, build_note=note,
    )
    return strategy, []


def strategy_of(a: Asked) -> tuple[Strategy, list[str]]:
    """The plan's ``Strategy`` for what the script asked, and what had to be assumed, in words."""
    driver = "lightning" if a.trainer_precision else "loop"
    declared = a.deepspeed.get("optimizer") if a.engine in ZERO_ENGINES else None
    name = str(declared.get("type", "")) if isinstance(declared, Mapping) else a.optimizer
    optimizer, note = _optimizer(name, a.momentum)
    notes = [note] if note else []
    if a.engine in ZERO_ENGINES:
        strategy, more = _zero(a, optimizer, driver)
        return strategy, notes + more
    autocast = _precision(a.trainer_precision) if a.trainer_precision else "fp32"
    if a.engine in FSDP_ENGINES:
        # Lightning's "-true" gives FSDP a MixedPrecision of the model's own dtype: no fp32 copies behind it
        precision = autocast if autocast.endswith("-true") else a.half or autocast
        if a.policy_unknown:
            notes.append(f"the auto-wrap policy {a.policy_unknown} is not one shardtop reads: its units are taken "
                         "to be the model's repeated blocks")
        if a.mesh_dims > 1:
            notes.append("a device mesh of more than one dimension is planned as sharding over every rank")
        units = () if a.policy_unknown else tuple(r for r in a.units if r != 0) or (0,)
        strategy = Strategy(
            engine=a.engine, sharding=a.sharding or "FULL_SHARD", precision=precision,
            half_in_units_only=bool(a.half) and autocast == "fp32", offload_params=a.offload_params,
            units=units, root_wrapped=0 in a.units or bool(a.policy_unknown), built_whole=a.on_device,
            kept_whole=tuple(r for r in a.kept_whole if r in units),
            optimizer=optimizer, driver=driver,
            build_note="the whole model was on the device before the engine sharded it" if a.on_device else "",
        )
        return strategy, notes
    engine = a.engine if a.engine in (DDP, SINGLE) else SINGLE
    return Strategy(engine=engine, precision=autocast, optimizer=optimizer, driver=driver), notes
