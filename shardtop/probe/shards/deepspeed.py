"""DeepSpeed: ZeRO-3 partitioned parameters, ZeRO-1/2 optimizer partitions.

ZeRO-3 splits every parameter across the data-parallel ranks: the parameter
keeps its full size in ``ds_numel``/``ds_shape`` and this rank's part in
``ds_tensor`` (``ds_tensor.ds_numel`` elements, the last ranks padded).  This
holds for a model built inside ``deepspeed.zero.Init`` before any engine
exists, too; a model built outside it has plain parameters until the engine
partitions them (story 2's OOM happens in between).

ZeRO-1/2 keep every parameter whole on every rank (``replicated``) and
partition the optimizer (``zero_optim.py``).

Parameters ZeRO-3 keeps whole on every rank (``ds_persist``: at most
``stage3_param_persistence_threshold`` elements each) read ``persistent``:
from the first forward on, every rank holds them whole, for as long as the
engine runs, beside their partition (in a data-parallel group of one the
whole parameter is a view of its partition: held once).  A parameter gathered at the moment of
the snapshot (in use by a forward or backward) reads ``gathered``.  Either
counts what the rank holds now: its partition, and the whole parameter while
it is gathered.  Both are summed in ``info`` too.

Nothing here imports deepspeed: everything is read from the objects it made.
"""

from __future__ import annotations

from typing import Any

from shardtop.probe.shards.optim import add_grads, add_optimizer_state
from shardtop.probe.shards.placement import add_plain
from shardtop.probe.shards.quantized import logical_numel
from shardtop.probe.shards.table import (
    GATHERED,
    OFFLOADED,
    PERSISTENT,
    REPLICATED,
    SHARDED,
    UNSHARDED,
    ShardTable,
    dtype_name,
)
from shardtop.probe.shards.tree import ModuleTree
from shardtop.probe.shards.zero_optim import (
    Ranks,
    add_stage3_optimizer,
    is_zero_optimizer,
    partition_numel,
    read_optimizer_partitions,
)
from shardtop.rundir.events import Unit

ENGINE_CLASS = "DeepSpeedEngine"


def is_engine(module: Any) -> bool:
    return any(c.__name__ == ENGINE_CLASS for c in type(module).__mro__)


def is_zero3_param(param: Any) -> bool:
    return hasattr(param, "ds_id") and hasattr(param, "ds_tensor")


def find_engine(tree: ModuleTree) -> Any:
    return next((w for w, _ in tree.wrappers if is_engine(w)), None)


def read_deepspeed(tree: ModuleTree, table: ShardTable, engine: Any, optimizer: Any = None) -> str:
    """Fill ``table`` for a DeepSpeed engine (or a zero.Init model when ``engine`` is None)."""
    stage = int(_call(engine, "zero_optimization_stage", 3 if engine is None else 0) or 0)
    offload_param = _offload_device(_call(engine, "zero_offload_param"))
    zero_optimizer = _zero_optimizer(engine, optimizer)
    if stage >= 3 or (engine is None and any(is_zero3_param(p) for p in tree.params)):
        _read_partitioned(tree, table, offload_param != "none")
        add_stage3_optimizer(tree, table, zero_optimizer)
        stage = 3
    elif not (stage in (1, 2) and read_optimizer_partitions(tree, table, zero_optimizer, stage)):
        add_plain(tree, table, range(len(tree.params)), REPLICATED if engine is not None else UNSHARDED)
    add_grads(tree, table, range(len(tree.params)), {})
    if zero_optimizer is None:
        add_optimizer_state(tree, table, optimizer, {})
    _fill_info(table, engine, stage, offload_param, zero_optimizer)
    return f"zero{stage}" if stage else "ddp"


def _call(obj: Any, name: str, default: Any = None) -> Any:
    method = getattr(obj, name, None)
    if method is None:
        return default
    try:
        return method()
    except Exception:  # an engine half set up: keep what can be read
        return default


def _offload_device(config: Any) -> str:
    device = getattr(config, "device", None)
    value = getattr(device, "value", device)
    return str(value) if value else "none"


def _zero_optimizer(engine: Any, optimizer: Any) -> Any:
    """The ZeRO optimizer: the one passed in if it is one, else the engine's."""
    for candidate in (optimizer, getattr(engine, "optimizer", None)):
        if is_zero_optimizer(candidate):
            return candidate
    return None


def _read_partitioned(tree: ModuleTree, table: ShardTable, offload: bool) -> None:
    """ZeRO-3: each parameter's partition on this rank, one unit for the whole model."""
    ranks = Ranks()
    unit = table.add_unit(Unit(module=0, kind="zero3", numel=0, local_numel=0))
    numel_total = local_total = padded_total = count = 0
    kept = _Whole()
    gathered = _Whole()
    dtype = ""
    plain: list[int] = []
    for index, param in enumerate(tree.params):
        if not is_zero3_param(param):
            plain.append(index)
            continue
        part = param.ds_tensor
        numel = int(param.ds_numel)
        partition = int(getattr(part, "ds_numel", part.numel()))
        local = partition_numel(numel, partition, ranks.of(getattr(param, "ds_process_group", None)))
        device = "nvme" if _on_nvme(part) else part.device
        state = OFFLOADED if offload or part.device.type != param.device.type or device == "nvme" else SHARDED
        itemsize = part.element_size()
        stored = local
        whole = param.numel() == numel and numel > 0  # gathered: the whole parameter beside the partition
        beside = 0 if whole and _shares_storage(param, part) else numel  # a group of one views its partition
        if whole:
            stored, device = local + beside, param.device
        if getattr(param, "ds_persist", False):  # whole on every rank from the first forward on
            state = PERSISTENT
            kept.add(numel, beside * itemsize)
        elif whole:  # gathered for compute right now
            state = GATHERED
            gathered.add(numel, beside * itemsize)
        table.add(tree.param_rows[index], numel, stored, itemsize, table.device_id(device), table.state_id(state), unit,
                  logical_numel(param, numel))
        numel_total += numel
        local_total += local
        padded_total += partition
        count += 1
        dtype = dtype or dtype_name(part.dtype)
    table.units[unit] = Unit(
        module=0,
        kind="zero3",
        numel=numel_total,
        local_numel=padded_total,
        padding=padded_total - local_total,
        strategy="zero3",
        offload=offload,
        dtype=dtype,
        params=count,
    )
    count_plain, bytes_plain = add_plain(tree, table, plain)
    table.info.update(
        persistent_params=kept.params,
        persistent_numel=kept.numel,
        persistent_bytes=kept.nbytes,
        gathered_params=gathered.params,
        gathered_bytes=gathered.nbytes,
        unmanaged_params=count_plain,
        unmanaged_bytes=bytes_plain,
    )


class _Whole:
    """Parameters held whole next to their partition: how many, elements, bytes."""

    def __init__(self) -> None:
        self.params = self.numel = self.nbytes = 0

    def add(self, numel: int, nbytes: int) -> None:
        self.params += 1
        self.numel += numel
        self.nbytes += nbytes


def _shares_storage(param: Any, part: Any) -> bool:
    """Whether the whole parameter is its partition's own memory: a partition of one rank (a data-parallel
    group of one) is the whole parameter, and DeepSpeed gathers it by viewing the partition, not by a copy."""
    try:
        return bool(param.data.untyped_storage().data_ptr() == part.untyped_storage().data_ptr())
    except (RuntimeError, NotImplementedError, AttributeError):  # meta tensors, tensor subclasses
        return False


def _on_nvme(part: Any) -> bool:
    location = getattr(part, "final_location", None)
    return str(getattr(location, "value", location)) == "nvme"


def _fill_info(table: ShardTable, engine: Any, stage: int, offload_param: str, optimizer: Any) -> None:
    info = table.info
    info["zero_stage"] = stage
    info["offload_param"] = offload_param
    info["offload_optimizer"] = _offload_device(_call(engine, "zero_offload_optimizer"))
    if engine is None:
        info["zero_init"] = True  # partitioned by deepspeed.zero.Init, no engine yet
        return
    info["data_parallel_size"] = int(getattr(engine, "dp_world_size", 0) or 0)
    if stage >= 3:
        for key, method in (
            ("persistence_threshold", "zero_param_persistence_threshold"),
            ("model_persistence_threshold", "zero_model_persistence_threshold"),
        ):
            value = _call(engine, method)
            if isinstance(value, (int, float)) and value < 2**62:  # DeepSpeed's "no limit" is sys.maxsize
                info[key] = int(value)
    precision = "bfloat16" if _call(engine, "bfloat16_enabled") else "float16" if _call(engine, "fp16_enabled") else ""
    info["param_dtype"] = precision or "float32"
    if optimizer is not None:
        info["optimizer"] = type(optimizer).__name__
        counts = getattr(optimizer, "partition_count", None)
        if isinstance(counts, list) and counts:
            info["partition_count"] = int(counts[0])
        elif isinstance(counts, int):
            info["partition_count"] = counts
