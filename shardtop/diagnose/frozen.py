"""Frozen and trainable parameters in one FSDP unit (LoRA on a frozen model): gradient memory as
if nothing were frozen.

FSDP1 with ``use_orig_params=True`` lets frozen and trainable parameters share a unit's
FlatParameter, and the unit's gradient is then allocated for the whole FlatParameter shard,
frozen elements included (FSDP warns "the gradient memory usage will be higher than expected"
when it wraps such a module).  The rule speaks only where the gradients the ranks actually hold
show it: FSDP2 allocates gradients only for trainable parameters, so it stays silent there.
"""

from __future__ import annotations

from dataclasses import dataclass

from shardtop.diagnose.facts import ENGINE_WORDS, ITEMSIZES, Driver, driver_of, fmt
from shardtop.diagnose.finding import Evidence, Explanation, Rule
from shardtop.read.run_model import RunModel
from shardtop.rundir.engines import FSDP_ENGINES
from shardtop.words import list_names

FROZEN_GRAD_SHARE = 0.5
"""The gradients cover frozen elements when each rank holds, on average, gradient for its share of
the trainable elements plus at least half of its share of the frozen ones (the ranks of the job
together: for the trainable elements and half the frozen ones)."""

WASTED_MIN_BYTES = 4 << 20
"""Gradient memory for frozen elements is worth a finding from 4 MiB per rank up."""


@dataclass(frozen=True)
class FrozenInUnit(Evidence):
    engine: str
    world_size: int
    units: int
    """FSDP units that hold both frozen and trainable parameters."""
    unit_modules: tuple[str, ...]
    frozen_numel: int
    trainable_numel: int
    grad_numel: int
    """Gradient elements the ranks hold for those units, summed over the ranks that reported."""
    ranks: int
    """Ranks whose snapshot had those gradients: every rank of the job, or every rank rehearsed."""
    itemsize: int
    use_orig_params: bool | None
    driver: Driver
    unit_types: tuple[str, ...]
    """The classes the mixed units are rooted at (what the auto-wrap policy wraps now)."""
    rehearsed: bool = False
    """The ranks are a rehearsal's: some ranks of the job, each holding what it would in the job."""

    @property
    def grad_bytes_per_rank(self) -> int:
        return self.grad_numel * self.itemsize // max(self.ranks, 1)

    @property
    def needed_bytes_per_rank(self) -> int:
        """Gradient bytes the trainable elements need, spread over the job's ranks."""
        return self.trainable_numel * self.itemsize // max(self.world_size, 1)

    @property
    def wasted_bytes_per_rank(self) -> int:
        return max(0, self.grad_bytes_per_rank - self.needed_bytes_per_rank)


def find_frozen_in_unit(m: RunModel) -> FrozenInUnit | None:
    if m.engine not in FSDP_ENGINES:
        return None
    ranks = [r for r in m.engine_ranks if m.aligned(r.shards)]
    if not ranks or len(ranks) < len(m.expected_ranks):
        return None
    first = ranks[0].shards
    assert first is not None
    mixed = [i for i, u in enumerate(first.units) if u.kind in FSDP_ENGINES and 0 < u.frozen < u.numel]
    if not mixed:
        return None
    grads = 0
    for r in ranks:
        s = r.shards
        assert s is not None
        if len(s.units) != len(first.units):
            return None
        measured = [s.units[i].grad_numel for i in mixed]
        if any(g is None for g in measured):
            return None  # no gradient at this snapshot: nothing measured, nothing said
        grads += sum(g or 0 for g in measured)
    units = [first.units[i] for i in mixed]
    frozen = sum(u.frozen for u in units)
    trainable = sum(u.numel - u.frozen for u in units)
    if grads * m.world_size < (trainable + FROZEN_GRAD_SHARE * frozen) * len(ranks):
        return None
    found = FrozenInUnit(
        engine=m.engine,
        world_size=m.world_size,
        units=len(units),
        unit_modules=tuple(m.path(u.module) for u in units),
        frozen_numel=frozen,
        trainable_numel=trainable,
        grad_numel=grads,
        ranks=len(ranks),
        itemsize=ITEMSIZES.get(units[0].dtype, 4),
        use_orig_params=orig if isinstance(orig := first.info.get("use_orig_params"), bool) else None,
        driver=driver_of(m),
        unit_types=tuple(dict.fromkeys(m.type_of(u.module) for u in units if m.type_of(u.module))),
        rehearsed=m.rehearsal is not None,
    )
    return found if found.wasted_bytes_per_rank >= WASTED_MIN_BYTES else None


def explain_frozen_in_unit(e: FrozenInUnit) -> Explanation:
    engine = ENGINE_WORDS.get(e.engine, e.engine)
    total = e.frozen_numel + e.trainable_numel
    detail = (
        f"{e.units} {engine} unit(s) ({list_names(e.unit_modules)}) hold frozen and trainable parameters together: "
        f"{e.frozen_numel:,} frozen and {e.trainable_numel:,} trainable values ({e.frozen_numel / total:.0%} frozen). "
        f"The {f'{e.ranks} rehearsed rank(s)' if e.rehearsed else 'ranks'} hold gradient for "
        f"{e.grad_numel:,} values of those units — {fmt(e.grad_bytes_per_rank)} per rank, "
        f"where the trainable ones need {fmt(e.needed_bytes_per_rank)}: the gradient covers the unit's whole "
        "flattened shard, frozen values included, as if nothing were frozen."
    )
    policy = "{" + ", ".join((*e.unit_types, "YourAdapter")) + "}"
    if e.driver == "lightning":
        wrap = f"`FSDPStrategy(auto_wrap_policy={policy})`"
    else:
        wrap = f"`auto_wrap_policy=ModuleWrapPolicy({policy})`"
    fix = (
        "Put the trainable parameters in units of their own: add the class of the modules that hold them (the "
        f"LoRA adapters, say) to the auto-wrap policy, {wrap}, or use a `lambda_auto_wrap_policy` that wraps every "
        "module whose parameters all require grad. The frozen units then have no gradient at all. FSDP2 "
        "(fully_shard) allocates gradients for trainable parameters only."
    )
    return Explanation(
        title=f"Gradients for frozen parameters: {fmt(e.wasted_bytes_per_rank)} per rank "
        f"({e.units} FSDP unit(s) mix frozen and trainable parameters)",
        detail=detail,
        fix=fix,
        severity="warning",
        saving_bytes=e.wasted_bytes_per_rank,
        modules=e.unit_modules,
    )


FROZEN_IN_UNIT = Rule("fsdp-frozen-and-trainable-in-one-unit", find_frozen_in_unit, explain_frozen_in_unit)
