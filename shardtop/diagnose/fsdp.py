"""FSDP rules: one unit for everything, layers outside every unit, a mesh that shards
nothing, fp16 without loss scaling, offload that is not in effect.

Each rule takes the run's ``RunFacts`` and returns one ``Finding`` or None.
"""

from __future__ import annotations

from shardtop.diagnose.facts import (
    FSDP_ENGINES,
    RankFacts,
    RunFacts,
    covering_rows,
    fmt,
    list_names,
)
from shardtop.diagnose.finding import Finding
from shardtop.events import Oom, Shards

SINGLE_UNIT_MIN_SHARE = 0.9
"""One FSDP unit counts as "the whole model in one unit" when it manages at least 90 % of
the parameter bytes: what is left outside is too small to change the all-gather peak."""

UNMANAGED_MIN_SHARE = 0.01
"""Parameters outside every FSDP unit are worth a finding from 1 % of the model up: below
that, a stray LayerNorm or bias held whole costs nothing anyone would notice."""

FP16_NAMES = frozenset({"float16", "torch.float16", "half", "fp16"})
"""How the probe may spell float16 in ``param_dtype``."""

FULL_PRECISIONS = ("32", "64")
"""Lightning precision settings (``32``, ``32-true``, ``64-true``) under which no grad scaler runs."""


def _fsdp_rank(f: RunFacts) -> RankFacts | None:
    """The lowest rank with an FSDP snapshot aligned with the tree."""
    if f.engine not in FSDP_ENGINES:
        return None
    for r in f.engine_ranks:
        if f.aligned(r.shards):
            return r
    return None


def _oom_in(f: RunFacts, phases: tuple[str, ...]) -> Oom | None:
    return next((o for o in f.ooms if o.phase in phases), None)


def _block_names(f: RunFacts) -> tuple[str, str]:
    """(type name, where the instances live) of the repeated block, with placeholders."""
    block = f.block
    if block is None:
        return "YourBlock", "model.layers"
    return block.type_name, block.container or "model"


def fsdp_single_unit(f: RunFacts) -> Finding | None:
    """FSDP without an auto-wrap policy: the root is the only unit and gathers everything at once."""
    r = _fsdp_rank(f)
    if r is None or r.shards is None:
        return None
    s = r.shards
    units = [u for u in s.units if u.kind in FSDP_ENGINES]
    count = s.info.get("fsdp_units", len(units))
    if count != 1 or len(units) != 1:
        return None
    unit = units[0]
    covered = f.subtree_bytes[unit.module] if 0 <= unit.module < len(f.subtree_bytes) else 0
    if not f.full_bytes or covered < SINGLE_UNIT_MIN_SHARE * f.full_bytes:
        return None
    block = f.block
    block_type, container = _block_names(f)
    root_path = f.path(unit.module)
    where = f"`{root_path}`" if root_path else "the root module"
    detail = (
        f"One FSDP unit, rooted at {where}, manages {unit.params or 'all the'} parameter tensors "
        f"({fmt(covered)}, {covered / f.full_bytes:.0%} of the model): no auto-wrap policy split the model into "
        f"smaller units. Each rank stores only its shard between uses ({fmt(r.param_bytes)} on rank {r.rank}), "
        f"but every forward and backward all-gathers the whole unit at once: {fmt(covered)} per rank at the peak, "
        "as if nothing were sharded."
    )
    if block is not None:
        detail += (
            f" The model repeats {block.count} × {block.type_name} (the largest {fmt(block.largest_bytes)}): "
            f"wrapped one unit each, only about one {block.type_name} is gathered at a time."
        )
    if f.engine == "fsdp2":
        fix = (
            f"Call fully_shard on each {block_type} before the root: "
            f"`for block in {container}: fully_shard(block)`, then `fully_shard(model)`"
            + (" (in configure_model())." if f.lightning else ".")
        )
    elif f.lightning:
        fix = (
            "Give the strategy an auto-wrap policy on the repeated block: "
            f"`FSDPStrategy(auto_wrap_policy={{{block_type}}})`."
        )
    else:
        fix = (
            "Give FSDP an auto-wrap policy on the repeated block: "
            f"`FSDP(model, auto_wrap_policy=ModuleWrapPolicy({{{block_type}}}), ...)`."
        )
    oom = _oom_in(f, ("forward", "backward"))
    return Finding(
        code="fsdp-single-unit",
        title="FSDP wraps the whole model in one unit: every step gathers all parameters at once",
        detail=detail + (f" Rank {oom.rank} ran out of memory during {oom.phase}." if oom else ""),
        fix=fix,
        severity="error" if oom else "warning",
        saving_bytes=max(0, covered - block.largest_bytes) if block is not None else None,
        modules=(f.path(unit.module),),
        evidence={
            "fsdp_units": 1,
            "unit_bytes": covered,
            "model_bytes": f.full_bytes,
            "block_type": block_type,
            "block_count": block.count if block else 0,
            "largest_block_bytes": block.largest_bytes if block else 0,
        },
    )


def _unmanaged(f: RunFacts, s: Shards) -> tuple[list[int], int, int]:
    """(outermost rows outside every unit, their parameter count, their full bytes)."""
    tree = f.tree
    assert tree is not None
    selected = [u < 0 for u in s.unit]
    has_params = [b > 0 for b in tree.bytes]
    rows = covering_rows(selected, has_params, tree.parents)
    params = sum(p for p, u in zip(tree.params, s.unit) if u < 0)
    full = sum(b for b, u in zip(tree.bytes, s.unit) if u < 0)
    return rows, params, full


def _devices_of(s: Shards, rows_mask: list[bool]) -> list[str]:
    found = {s.devices[d] for d, b, m in zip(s.device, s.bytes, rows_mask) if m and b and 0 <= d < len(s.devices)}
    return sorted(found)


def fsdp_manual_wrap_ignored(f: RunFacts) -> Finding | None:
    """Some layers wrapped by hand, the root not wrapped: the rest is held whole on every rank."""
    r = _fsdp_rank(f)
    if r is None or r.shards is None:
        return None
    s = r.shards
    if s.info.get("root_wrapped") is not False or not f.full_bytes:
        return None
    stray_rows, stray_params, stray_full = _unmanaged(f, s)
    unmanaged = int(s.info.get("unmanaged_bytes", stray_full) or 0)
    if unmanaged < UNMANAGED_MIN_SHARE * f.full_bytes or not stray_rows:
        return None
    n = max(f.world_size, 1)
    unit_roots = sorted({u.module for u in s.units})
    unit_names = [f.path(m) for m in unit_roots]
    stray_devices = _devices_of(s, [u < 0 for u in s.unit])
    unit_devices = _devices_of(s, [u >= 0 for u in s.unit])
    block_type, _ = _block_names(f)
    stray_names = [f.path(row) for row in stray_rows]
    where = f"on {', '.join(stray_devices)}" if stray_devices else ""
    if unit_devices and stray_devices and set(unit_devices) != set(stray_devices):
        where += f", while the units' shards are on {', '.join(unit_devices)}"
    detail = (
        f"{len(unit_roots)} module(s) are FSDP units — {list_names(unit_names)} — and the root is not wrapped. "
        f"{stray_params:,} parameter values ({fmt(unmanaged)}, "
        f"{unmanaged / f.full_bytes:.0%} of the model) in {list_names(stray_names)} belong to no unit: FSDP does "
        f"not shard them, so each of the {n} rank(s) holds them whole{' ' + where if where else ''}."
    )
    how = str(s.info.get("driver") or "")
    if f.lightning or "configure_sharded_model" in how:
        detail += (
            " This is what Lightning does once a LightningModule overrides the deprecated configure_sharded_model "
            "hook (even as a no-op): it neither wraps the root nor moves the model, so every layer not wrapped by "
            "hand stays where __init__ put it, and an auto_wrap_policy is not applied at all."
        )
    detail += (
        " Placing modules on different GPUs by hand (module.to('cuda:1')) would not shard anything either: each "
        "GPU would hold whole layers and wait for the other; FSDP already splits every wrapped layer over all GPUs."
    )
    lightning_story = f.lightning or "configure_sharded_model" in how
    if lightning_story:
        fix = (
            "Delete configure_sharded_model. Let `FSDPStrategy(auto_wrap_policy={" + block_type + "})` wrap the "
            "layers (or create them in configure_model()), so Lightning wraps the root too and moves the model: "
            "every parameter then belongs to a unit and is sharded."
        )
    raw_fix = (
        "Wrap the root as well: `FSDP(model, auto_wrap_policy=ModuleWrapPolicy({" + block_type + "}))`. "
        "Everything outside the blocks then belongs to the root unit and is sharded too."
    )
    if not lightning_story:
        fix = raw_fix
    elif not f.lightning:
        fix += " Without Lightning: " + raw_fix[0].lower() + raw_fix[1:]
    return Finding(
        code="fsdp-manual-wrap-ignored",
        title=f"{fmt(unmanaged)} of parameters are outside every FSDP unit, held whole on every rank",
        detail=detail,
        fix=fix,
        severity="warning",
        saving_bytes=unmanaged * (n - 1) // n,
        modules=tuple(stray_names),
        evidence={
            "fsdp_units": len(unit_roots),
            "root_wrapped": 0,
            "unmanaged_bytes": unmanaged,
            "unmanaged_modules": len(stray_rows),
            "unmanaged_devices": ",".join(stray_devices),
            "unit_devices": ",".join(unit_devices),
            "world_size": n,
        },
    )


def fsdp2_no_data_parallel(f: RunFacts) -> Finding | None:
    """FSDP2 on a data-parallel mesh of size 1 shards nothing."""
    if f.engine != "fsdp2" or f.world_size < 2:
        return None
    r = f.first_engine_rank()
    if r is None or r.shards is None:
        return None
    info = r.shards.info
    if info.get("data_parallel_size") != 1:
        return None
    n = f.world_size
    mesh_shape = str(info.get("mesh_shape") or info.get("dp_mesh_shape") or "")
    mesh_dims = str(info.get("mesh_dims") or info.get("dp_mesh_dims") or "")
    mesh = f" is {mesh_shape} ({mesh_dims})" if mesh_shape else ""
    detail = (
        f"fully_shard splits parameters over the data-parallel mesh dimension, and it has size 1: the device "
        f"mesh{mesh}, so the {n} processes are not on the data-parallel axis. Nothing is sharded: rank {r.rank} "
        f"holds {fmt(r.param_bytes)} of parameters — the whole model is {fmt(f.full_bytes)} — and every rank "
        "holds the same."
    )
    if f.strategy == "ModelParallelStrategy" or f.lightning:
        detail += (
            " Lightning's ModelParallelStrategy() defaults to data_parallel_size='auto', "
            "tensor_parallel_size='auto', which puts all the processes of a node on the tensor-parallel axis "
            "and only nodes on the data-parallel one."
        )
        fix = (
            f"`ModelParallelStrategy(data_parallel_size={n}, tensor_parallel_size=1)` — or, if tensor parallelism "
            "was the plan, parallelize the layers over device_mesh['tensor_parallel'] with parallelize_module."
        )
    else:
        fix = (
            f'Shard over all {n} ranks: `mesh = init_device_mesh(device_type, ({n},), mesh_dim_names=("dp",))` '
            "and `fully_shard(module, mesh=mesh)`."
        )
    return Finding(
        code="fsdp2-no-data-parallel",
        title="FSDP2's data-parallel mesh has size 1: nothing is sharded",
        detail=detail,
        fix=fix,
        severity="warning",
        saving_bytes=r.param_bytes * (n - 1) // n,
        evidence={
            "data_parallel_size": 1,
            "world_size": n,
            "mesh_shape": mesh_shape,
            "mesh_dims": mesh_dims,
            "rank_param_bytes": r.param_bytes,
        },
    )


def precision_mismatch(f: RunFacts) -> Finding | None:
    """fp16 FSDP mixed precision without a grad scaler (Trainer(precision=32))."""
    if f.engine not in FSDP_ENGINES:
        return None
    info = f.info
    param_dtype = str(info.get("param_dtype") or "")
    if param_dtype not in FP16_NAMES:
        return None
    precision = str(info.get("precision") or "")
    scaling = info.get("loss_scaling")
    if scaling is True or not (precision.startswith(FULL_PRECISIONS) or scaling is False):
        return None
    reduce_dtype = str(info.get("reduce_dtype") or "")
    detail = (
        f"FSDP computes in float16 (MixedPrecision param_dtype={param_dtype}"
        + (f", reduce_dtype={reduce_dtype}" if reduce_dtype else "")
        + ")"
        + (f", but the run uses precision={precision!r}" if precision else "")
        + " and scales no loss. float16 gradients without a GradScaler underflow to zero when small and overflow "
        "when large, so training can stall or diverge without an error."
    )
    if f.lightning or precision:
        detail += " Lightning adds FSDP's sharded grad scaler only under precision='16-mixed'."
        fix = (
            '`Trainer(precision="16-mixed")` (Lightning then adds the sharded grad scaler and sets the '
            'fp16 MixedPrecision itself), or bfloat16: `Trainer(precision="bf16-mixed")`, which needs no scaler.'
        )
    else:
        fix = (
            "Scale the loss with `torch.distributed.fsdp.sharded_grad_scaler.ShardedGradScaler` "
            "(`scaler.scale(loss).backward(); scaler.step(opt); scaler.update()`), or use "
            "`MixedPrecision(param_dtype=torch.bfloat16)`, which needs no scaler."
        )
    return Finding(
        code="precision-mismatch",
        title="float16 mixed precision without loss scaling",
        detail=detail,
        fix=fix,
        severity="warning",
        evidence={"param_dtype": param_dtype, "precision": precision, "loss_scaling": 0},
    )


def cpu_offload_not_applied(f: RunFacts) -> Finding | None:
    """cpu_offload was asked for, but no unit offloads."""
    if f.engine not in FSDP_ENGINES or not f.info.get("cpu_offload_requested"):
        return None
    r = _fsdp_rank(f)
    if r is None or r.shards is None:
        return None
    s = r.shards
    if s.info.get("offload") or any(u.offload for u in s.units):
        return None
    devices = sorted(r.by_device)
    where = ", ".join(devices) or "?"
    detail = f"cpu_offload was requested, but no FSDP unit offloads its parameters: they stay on {where}."
    if devices == ["cpu"]:
        detail += (
            " These ranks run on CPU, where there is nothing to offload to (FSDP pins offloaded shards in "
            "page-locked memory, which needs a GPU); on GPUs the same setting keeps the shards in host memory."
        )
    if s.info.get("root_wrapped") is False:
        detail += " Offloading only ever applies to FSDP units: layers outside every unit are never offloaded."
    return Finding(
        code="cpu-offload-not-applied",
        title="CPU offload was requested but is not in effect",
        detail=detail,
        fix="On GPUs, pass `cpu_offload=CPUOffload(offload_params=True)` to every unit (Lightning: "
        "`FSDPStrategy(cpu_offload=True)` with the layers wrapped by the strategy, not by hand).",
        severity="info",
        evidence={"devices": ",".join(devices)},
    )
