"""FSDP rules on how the model is wrapped: most of the model in one unit, layers outside every
unit, a mesh that shards nothing.  FSDP settings that do not take effect: ``fsdp_settings.py``."""

from __future__ import annotations

from dataclasses import dataclass

from shardtop.diagnose.facts import Driver, OomEvidence, driver_of, first_oom_evidence, fmt
from shardtop.diagnose.finding import Evidence, Explanation, Rule
from shardtop.read.rank_facts import RankFacts
from shardtop.read.run_model import RunModel
from shardtop.read.tree_facts import covering_rows
from shardtop.rundir.engines import FSDP2, FSDP_ENGINES
from shardtop.rundir.events import Shards
from shardtop.words import list_names

SINGLE_UNIT_MIN_SHARE = 0.9
"""One FSDP unit holds "nearly all of the model" when its own parameters are at least 90 % of
the parameter bytes: whatever the other units hold is too small to change the all-gather peak."""

UNMANAGED_MIN_SHARE = 0.01
"""Parameters outside every FSDP unit are worth a finding from 1 % of the model up: below
that, a stray LayerNorm or bias held whole costs nothing anyone would notice."""

GATHERING_STRATEGIES = frozenset({"FULL_SHARD", "SHARD_GRAD_OP", "HYBRID_SHARD", "_HYBRID_SHARD_ZERO2"})
"""Strategies that all-gather a unit's parameters for its forward (NO_SHARD never gathers)."""

def fsdp_rank(m: RunModel) -> RankFacts | None:
    """The lowest rank with an FSDP snapshot aligned with the tree."""
    if m.engine not in FSDP_ENGINES:
        return None
    return next((r for r in m.engine_ranks if m.aligned(r.shards)), None)


def _block_names(m: RunModel) -> tuple[str, str]:
    """(type name, where the instances live) of the repeated block, with placeholders."""
    block = m.block
    if block is None:
        return "YourBlock", "model.layers"
    return block.type_name, block.container or "model"


# -- fsdp-single-unit ---------------------------------------------------------------------------


@dataclass(frozen=True)
class SingleUnit(Evidence):
    engine: str
    driver: Driver
    rank: int
    rank_param_bytes: int
    units: int
    unit_module: str
    unit_bytes: int
    """Full bytes of the parameters the largest unit manages itself (not its child units')."""
    unit_params: int
    strategy: str
    model_bytes: int
    block_type: str
    block_container: str
    block_count: int
    largest_block_bytes: int
    largest_layer: str
    """The module whose own parameters are the largest part of the unit's."""
    largest_layer_type: str
    largest_layer_bytes: int
    oom: OomEvidence | None

    @property
    def one_layer(self) -> bool:
        """One layer is nearly the whole model: no wrapping can split a layer's parameters over units."""
        return self.largest_layer_bytes >= SINGLE_UNIT_MIN_SHARE * self.model_bytes


def _largest_layer(m: RunModel, s: Shards, unit: int) -> tuple[int, int]:
    """(row, bytes) of the module with the most parameters of its own among those ``unit`` manages."""
    tree = m.tree
    assert tree is not None
    rows = [(b, row) for row, (b, u) in enumerate(zip(tree.bytes, s.unit, strict=True)) if u == unit]
    b, row = max(rows, default=(0, -1))
    return row, b


def managed_bytes(m: RunModel, s: Shards) -> list[int]:
    """Full parameter bytes each unit manages itself (rows whose innermost unit it is)."""
    tree = m.tree
    assert tree is not None
    out = [0] * len(s.units)
    for b, u in zip(tree.bytes, s.unit, strict=True):
        if 0 <= u < len(out):
            out[u] += b
    return out


def find_single_unit(m: RunModel) -> SingleUnit | None:
    r = fsdp_rank(m)
    if r is None or r.shards is None or not m.full_bytes:
        return None
    s = r.shards
    units = [i for i, u in enumerate(s.units) if u.kind in FSDP_ENGINES]
    if not units:
        return None
    managed = managed_bytes(m, s)
    biggest = max(units, key=managed.__getitem__)
    unit = s.units[biggest]
    if managed[biggest] < SINGLE_UNIT_MIN_SHARE * m.full_bytes or unit.strategy not in GATHERING_STRATEGIES:
        return None
    block = m.block
    block_type, container = _block_names(m)
    layer_row, layer_bytes = _largest_layer(m, s, biggest)
    return SingleUnit(
        engine=m.engine,
        driver=driver_of(m),
        rank=r.rank,
        rank_param_bytes=r.param_bytes,
        units=len(units),
        unit_module=m.path(unit.module),
        unit_bytes=managed[biggest],
        unit_params=unit.params,
        strategy=unit.strategy,
        model_bytes=m.full_bytes,
        block_type=block_type,
        block_container=container,
        block_count=block.count if block else 0,
        largest_block_bytes=block.largest_bytes if block else 0,
        largest_layer=m.path(layer_row) if layer_row >= 0 else "",
        largest_layer_type=m.type_of(layer_row) if layer_row >= 0 else "",
        largest_layer_bytes=layer_bytes,
        oom=first_oom_evidence(m, ("forward", "backward")),
    )


def explain_one_layer(e: SingleUnit) -> Explanation:
    """Nearly the whole model is one layer: say what the peak holds, and no fix (none in the wrapping exists)."""
    layer = f"`{e.largest_layer}`" if e.largest_layer else "the root module"
    share = e.largest_layer_bytes / e.model_bytes
    oom = f" Rank {e.oom.rank} ran out of memory during {e.oom.phase}." if e.oom is not None else ""
    return Explanation(
        title=f"One layer is {share:.0%} of the model: FSDP gathers all of it at once, however it is wrapped",
        detail=(
            f"{layer} ({e.largest_layer_type}) holds {fmt(e.largest_layer_bytes)} of parameters, {share:.0%} of "
            f"the model. Each rank stores only its shard between uses ({fmt(e.rank_param_bytes)} on rank "
            f"{e.rank}), but FSDP gathers a layer's parameters whole for its forward and its backward, so every "
            f"rank's peak holds all {fmt(e.largest_layer_bytes)} of it. Wrapping cannot split one layer's "
            f"parameters over several units.{oom}"
        ),
        fix="",
        severity="error" if e.oom is not None else "info",
        modules=(e.largest_layer,) if e.largest_layer else (),
    )


def explain_single_unit(e: SingleUnit) -> Explanation:
    if e.one_layer:
        return explain_one_layer(e)
    where = f"`{e.unit_module}`" if e.unit_module else "the root module"
    share = e.unit_bytes / e.model_bytes
    others = f" (the other {e.units - 1} unit(s) hold the remaining {1 - share:.0%})" if e.units > 1 else ""
    detail = (
        f"{'One FSDP unit' if e.units == 1 else f'Of {e.units} FSDP units, one'}, rooted at {where}, manages "
        f"{e.unit_params or 'all the'} parameter tensors itself ({fmt(e.unit_bytes)}, {share:.0%} of the model)"
        f"{others}: no auto-wrap policy split the model into smaller units. Each rank stores only its shard between "
        f"uses ({fmt(e.rank_param_bytes)} on rank {e.rank}), but every forward and backward all-gathers that unit "
        f"at once: {fmt(e.unit_bytes)} per rank at the peak, as if nothing were sharded."
    )
    if e.block_count:
        detail += (
            f" The model repeats {e.block_count} × {e.block_type} (the largest {fmt(e.largest_block_bytes)}): "
            f"wrapped one unit each, only about one {e.block_type} is gathered at a time."
        )
    if e.oom is not None:
        detail += f" Rank {e.oom.rank} ran out of memory during {e.oom.phase}."
    if e.engine == FSDP2:
        fix = (
            f"Call fully_shard on each {e.block_type} before the root: "
            f"`for block in {e.block_container}: fully_shard(block)`, then `fully_shard(model)`"
            + (" (in configure_model())." if e.driver == "lightning" else ".")
        )
    elif e.driver == "lightning":
        fix = (
            "Give the strategy an auto-wrap policy on the repeated block: "
            f"`FSDPStrategy(auto_wrap_policy={{{e.block_type}}})`."
        )
    else:
        fix = (
            "Give FSDP an auto-wrap policy on the repeated block: "
            f"`FSDP(model, auto_wrap_policy=ModuleWrapPolicy({{{e.block_type}}}), ...)`."
        )
    return Explanation(
        title="FSDP wraps nearly the whole model in one unit: every step gathers all of it at once"
        if e.units > 1
        else "FSDP wraps the whole model in one unit: every step gathers all parameters at once",
        detail=detail,
        fix=fix,
        severity="error" if e.oom is not None else "warning",
        saving_bytes=max(0, e.unit_bytes - e.largest_block_bytes) if e.block_count else None,
        modules=(e.unit_module,),
    )


SINGLE_UNIT = Rule("fsdp-single-unit", find_single_unit, explain_single_unit)


# -- fsdp-manual-wrap-ignored -------------------------------------------------------------------


@dataclass(frozen=True)
class StrayLayers(Evidence):
    world_size: int
    model_bytes: int
    unit_modules: tuple[str, ...]
    stray_modules: tuple[str, ...]
    stray_params: int
    stray_bytes: int
    stray_devices: tuple[str, ...]
    unit_devices: tuple[str, ...]
    configure_sharded_model: bool
    """Lightning's deprecated hook is the likely cause (the driver or the strategy says Lightning)."""
    driver: Driver
    block_type: str


def _devices_of(s: Shards, rows_mask: list[bool]) -> tuple[str, ...]:
    found = {
        s.devices[d]
        for d, b, m in zip(s.device, s.bytes, rows_mask, strict=True)
        if m and b and 0 <= d < len(s.devices)
    }
    return tuple(sorted(found))


def find_stray_layers(m: RunModel) -> StrayLayers | None:
    r = fsdp_rank(m)
    if r is None or r.shards is None or m.tree is None:
        return None
    s = r.shards
    if s.info.get("root_wrapped") is not False or not m.full_bytes:
        return None
    tree = m.tree
    outside = [u < 0 for u in s.unit]
    rows = covering_rows(outside, [b > 0 for b in tree.bytes], tree.parents)
    stray_full = sum(b for b, o in zip(tree.bytes, outside, strict=True) if o)
    unmanaged = int(s.info.get("unmanaged_bytes", stray_full) or 0)
    if unmanaged < UNMANAGED_MIN_SHARE * m.full_bytes or not rows:
        return None
    return StrayLayers(
        world_size=max(m.world_size, 1),
        model_bytes=m.full_bytes,
        unit_modules=tuple(m.path(row) for row in sorted({u.module for u in s.units})),
        stray_modules=tuple(m.path(row) for row in rows),
        stray_params=sum(p for p, o in zip(tree.params, outside, strict=True) if o),
        stray_bytes=unmanaged,
        stray_devices=_devices_of(s, outside),
        unit_devices=_devices_of(s, [not o for o in outside]),
        configure_sharded_model=m.lightning or "configure_sharded_model" in m.driver,
        driver=driver_of(m),
        block_type=_block_names(m)[0],
    )


def explain_stray_layers(e: StrayLayers) -> Explanation:
    where = f"on {', '.join(e.stray_devices)}" if e.stray_devices else ""
    if e.unit_devices and e.stray_devices and set(e.unit_devices) != set(e.stray_devices):
        where += f", while the units' shards are on {', '.join(e.unit_devices)}"
    detail = (
        f"{len(e.unit_modules)} module(s) are FSDP units — {list_names(e.unit_modules)} — and the root is not "
        f"wrapped. {e.stray_params:,} parameter values ({fmt(e.stray_bytes)}, {e.stray_bytes / e.model_bytes:.0%} "
        f"of the model) in {list_names(e.stray_modules)} belong to no unit: FSDP does not shard them, so each of "
        f"the {e.world_size} rank(s) holds them whole{' ' + where if where else ''}."
    )
    if e.configure_sharded_model:
        detail += (
            " This is what Lightning does once a LightningModule overrides the deprecated configure_sharded_model "
            "hook (even as a no-op): it neither wraps the root nor moves the model, so every layer not wrapped by "
            "hand stays where __init__ put it, and an auto_wrap_policy is not applied at all."
        )
    raw_fix = (
        "Wrap the root as well: `FSDP(model, auto_wrap_policy=ModuleWrapPolicy({" + e.block_type + "}))`. "
        "Everything outside the blocks then belongs to the root unit and is sharded too."
    )
    if e.configure_sharded_model:
        fix = (
            "Delete configure_sharded_model. Let `FSDPStrategy(auto_wrap_policy={" + e.block_type + "})` wrap the "
            "layers (or create them in configure_model()), so Lightning wraps the root too and moves the model: "
            "every parameter then belongs to a unit and is sharded."
        )
        if e.driver != "lightning":
            fix += " Without Lightning: " + raw_fix[0].lower() + raw_fix[1:]
    else:
        fix = raw_fix
    n = e.world_size
    return Explanation(
        title=f"{fmt(e.stray_bytes)} of parameters are outside every FSDP unit, held whole on every rank",
        detail=detail,
        fix=fix,
        severity="warning",
        saving_bytes=e.stray_bytes * (n - 1) // n,
        modules=e.stray_modules,
    )


STRAY_LAYERS = Rule("fsdp-manual-wrap-ignored", find_stray_layers, explain_stray_layers)


# -- fsdp2-no-data-parallel ---------------------------------------------------------------------


@dataclass(frozen=True)
class NoDataParallel(Evidence):
    world_size: int
    rank: int
    rank_param_bytes: int
    model_bytes: int
    mesh_shape: str
    mesh_dims: str
    lightning_default_mesh: bool


def find_no_data_parallel(m: RunModel) -> NoDataParallel | None:
    if m.engine != FSDP2 or m.world_size < 2:
        return None
    r = m.first_engine_rank()
    if r is None or r.shards is None or r.shards.info.get("data_parallel_size") != 1:
        return None
    info = r.shards.info
    return NoDataParallel(
        world_size=m.world_size,
        rank=r.rank,
        rank_param_bytes=r.param_bytes,
        model_bytes=m.full_bytes,
        mesh_shape=str(info.get("mesh_shape") or info.get("dp_mesh_shape") or ""),
        mesh_dims=str(info.get("mesh_dims") or info.get("dp_mesh_dims") or ""),
        lightning_default_mesh=m.strategy == "ModelParallelStrategy" or m.lightning,
    )


def explain_no_data_parallel(e: NoDataParallel) -> Explanation:
    n = e.world_size
    mesh = f" is {e.mesh_shape} ({e.mesh_dims})" if e.mesh_shape else ""
    detail = (
        f"fully_shard splits parameters over the data-parallel mesh dimension, and it has size 1: the device "
        f"mesh{mesh}, so the {n} processes are not on the data-parallel axis. Nothing is sharded: rank {e.rank} "
        f"holds {fmt(e.rank_param_bytes)} of parameters — the whole model is {fmt(e.model_bytes)} — and every rank "
        "holds the same."
    )
    if e.lightning_default_mesh:
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
    return Explanation(
        title="FSDP2's data-parallel mesh has size 1: nothing is sharded",
        detail=detail,
        fix=fix,
        severity="warning",
        saving_bytes=e.rank_param_bytes * (n - 1) // n,
    )


NO_DATA_PARALLEL = Rule("fsdp2-no-data-parallel", find_no_data_parallel, explain_no_data_parallel)
