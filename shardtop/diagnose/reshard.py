"""FSDP2 units that do not reshard after forward: from their forward to their backward each rank
holds them whole, so after the forward the rank holds what those units manage, unsharded.

FSDP2 never reshards a root after forward (its parameters would be gathered again at once for
backward).  The root is the first unit whose forward runs: when the loop calls the layers
directly and the model's own forward never runs (or the model was never ``fully_shard``-ed),
every layer becomes a root of its own, and the whole model stays gathered until backward.  A
unit given ``reshard_after_forward=False`` does the same, by choice.
"""

from __future__ import annotations

from dataclasses import dataclass

from shardtop.diagnose.facts import Driver, OomEvidence, driver_of, fmt, oom_avoided_by
from shardtop.diagnose.finding import Evidence, Explanation, Rule, Severity
from shardtop.diagnose.fsdp import fsdp_rank, managed_bytes
from shardtop.read.run_model import RunModel
from shardtop.rundir.engines import FSDP2
from shardtop.words import list_names

KEPT_STRATEGIES = frozenset({"SHARD_GRAD_OP", "_HYBRID_SHARD_ZERO2"})
"""How the probe names an FSDP2 unit that does not reshard after forward (in FSDP1's words)."""

KEPT_MIN_SHARE = 0.25
"""Units kept whole after forward are worth a finding from a quarter of the model up: the
usual single root holds embeddings and a head, a few per cent."""

KEPT_MIN_BYTES = 8 << 20
"""...and when resharding them would free at least 8 MiB per rank."""


@dataclass(frozen=True)
class NotResharded(Evidence):
    rank: int
    world_size: int
    shard_group_size: int
    units: int
    """Units that keep their parameters gathered from forward to backward (the one true root aside)."""
    own_roots: int
    """Of those, the units that are roots of their own (their forward ran before any enclosing unit's)."""
    unit_modules: tuple[str, ...]
    kept_bytes: int
    """Full bytes those units manage: what each rank holds of them between forward and backward."""
    model_bytes: int
    gathered_bytes: int
    """Parameter bytes the rank's latest snapshot caught gathered (0: none was taken mid-step)."""
    snapshot: str
    """The stage of that snapshot (``engine``, ``step``)."""
    driver: Driver
    oom: OomEvidence | None
    """An OOM in forward or backward that resharding would have avoided."""

    @property
    def freed_bytes(self) -> int:
        """What resharding after forward frees per rank: all but the rank's shard."""
        return self.kept_bytes - self.kept_bytes // max(self.shard_group_size, 1)


def find_not_resharded(m: RunModel) -> NotResharded | None:
    if m.engine != FSDP2:
        return None
    r = fsdp_rank(m)
    if r is None or r.shards is None or not m.full_bytes:
        return None
    s = r.shards
    shard = s.info.get("shard_group_size")
    shard_size = shard if isinstance(shard, int) else 1
    if shard_size < 2:
        return None  # nothing is sharded, so nothing is kept gathered that would not be anyway
    fsdp2 = [i for i, u in enumerate(s.units) if u.kind == FSDP2 and u.numel]
    roots = [i for i in fsdp2 if s.units[i].root]
    kept = [i for i in fsdp2 if s.units[i].strategy in KEPT_STRATEGIES and not (len(roots) == 1 and i in roots)]
    managed = managed_bytes(m, s)
    kept_bytes = sum(managed[i] for i in kept)
    if not kept or kept_bytes < KEPT_MIN_SHARE * m.full_bytes:
        return None
    freed = kept_bytes - kept_bytes // shard_size
    if freed < KEPT_MIN_BYTES:
        return None
    gathered = s.states.index("gathered") if "gathered" in s.states else -2
    held_gathered = sum(b for b, st in zip(s.bytes, s.state, strict=True) if st == gathered)
    return NotResharded(
        rank=r.rank,
        world_size=m.world_size,
        shard_group_size=shard_size,
        units=len(kept),
        own_roots=sum(1 for i in kept if s.units[i].root) if len(roots) > 1 else 0,
        unit_modules=tuple(m.path(s.units[i].module) for i in kept),
        kept_bytes=kept_bytes,
        model_bytes=m.full_bytes,
        gathered_bytes=held_gathered,
        snapshot=s.stage,
        driver=driver_of(m),
        oom=oom_avoided_by(m, freed, ("forward", "backward")),
    )


def explain_not_resharded(e: NotResharded) -> Explanation:
    share = e.kept_bytes / e.model_bytes
    s = e.shard_group_size
    if e.own_roots:
        detail = (
            f"{e.own_roots} FSDP2 units ({list_names(e.unit_modules)}) are each a root of their own: FSDP2 makes "
            "the first unit whose forward runs the root, and here each one's forward ran before any enclosing "
            "unit's (the model's own forward never ran, or the model itself was not passed to fully_shard). FSDP2 "
            "never reshards a root after forward."
        )
    else:
        detail = (
            f"{e.units} FSDP2 unit(s) ({list_names(e.unit_modules)}) do not reshard after forward "
            "(reshard_after_forward=False)."
        )
    detail += (
        f" From each one's forward to its backward, every rank holds its parameters whole: after the forward, "
        f"{fmt(e.kept_bytes)} ({share:.0%} of the model's {fmt(e.model_bytes)}), where 1/{s} of it "
        f"({fmt(e.kept_bytes // s)}) would be held otherwise."
    )
    if e.gathered_bytes:
        detail += (
            f" Rank {e.rank}'s latest snapshot (stage {e.snapshot}) caught {fmt(e.gathered_bytes)} of parameters "
            "gathered."
        )
    if e.oom is not None:
        detail += (
            f" Rank {e.oom.rank} ran out of memory during {e.oom.phase}, asking for {fmt(e.oom.requested_bytes)}: "
            f"resharding after forward frees {fmt(e.freed_bytes)} per rank."
        )
    where = " (in configure_model())" if e.driver == "lightning" else ""
    severity: Severity
    if e.own_roots:
        fix = (
            f"Call fully_shard on the model too, after its layers{where}, and run the model's own forward "
            "(`model(x)`), not its layers one by one: the model is then the one root and every layer reshards "
            "after its forward. Where the layers must be called directly, pass `reshard_after_forward=True` to "
            "fully_shard on each of them."
        )
        severity = "warning"
    else:
        fix = (
            f"If memory is short, pass `reshard_after_forward=True` (the default) to fully_shard on those units"
            f"{where}: each is then all-gathered once more in backward, and holds 1/{s} between forward and backward."
        )
        severity = "info"
    return Explanation(
        title=f"{fmt(e.kept_bytes)} of parameters stay gathered from forward to backward on every rank "
        f"({e.units} FSDP2 unit(s) never reshard after forward)",
        detail=detail,
        fix=fix,
        severity="error" if e.oom is not None else severity,
        saving_bytes=e.freed_bytes,
        modules=e.unit_modules,
    )


NOT_RESHARDED = Rule("fsdp2-not-resharded", find_not_resharded, explain_not_resharded)
