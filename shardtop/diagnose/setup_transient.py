"""``sharding-transient-at-setup``: a rank ran out of memory while the engine was sharding the model,
holding the parameters it had reached twice, whole and sharded.

FSDP2's ``fully_shard`` makes each parameter's shard while the whole parameter it was given stays
alive until the call returns (torch frees it then, so that given parameters may alias).  A model
built whole on the device the run uses therefore peaks at set-up at the whole model plus the shards
made so far.  A rank that runs out there is caught part-way: its shards snapshot at the OOM
(stage ``oom``) shows the parameters the running call had sharded (sharded, in no finished unit
yet) beside those still whole, while its peers, past the call, hold their shards.  That is a moment
of set-up, not an uneven share (``placement.py`` does not compare such ranks).
"""

from __future__ import annotations

from dataclasses import dataclass

from shardtop.diagnose.facts import Driver, OomEvidence, driver_of, fmt
from shardtop.diagnose.finding import Evidence, Explanation, Rule
from shardtop.read.run_model import RunModel
from shardtop.read.tree_facts import covering_rows
from shardtop.words import list_names, module_label

HOLDS_WHAT_IT_WAS_GIVEN = {
    "fully_shard": "fully_shard keeps the parameters it was given whole until it returns",
}
"""Engine steps that shard parameters they were handed whole, with why the whole copies stay meanwhile."""


@dataclass(frozen=True)
class PeerHolding:
    """A rank that got past the engine's sharding, and the parameter bytes it holds."""

    rank: int
    param_bytes: int


@dataclass(frozen=True)
class SetupTransient(Evidence):
    oom: OomEvidence
    engine_step: str
    model_bytes: int
    world_size: int
    whole_bytes: int
    """Parameter bytes the rank held whole at the OOM: those not reached yet, and those the running call had
    sharded (kept whole by it until it returns)."""
    shard_bytes: int
    """Shards the rank held at the OOM."""
    twice: tuple[str, ...]
    """The modules the running call had sharded: held whole and sharded at once."""
    twice_bytes: int
    """Their whole size."""
    peers: tuple[PeerHolding, ...]
    driver: Driver


def find_setup_transient(m: RunModel) -> SetupTransient | None:
    story = next((s for s in m.ooms if s.oom.phase == "setup" and s.oom.engine_step in HOLDS_WHAT_IT_WAS_GIVEN),
                 None)
    tree = m.tree
    rank = m.rank(story.rank) if story is not None else None
    if story is None or tree is None or rank is None:
        return None
    s = rank.state.shards
    if s is None or s.stage != "oom" or not m.aligned(s):
        return None
    sharded = s.states.index("sharded") if "sharded" in s.states else -2
    whole = s.states.index("unsharded") if "unsharded" in s.states else -2
    in_call = [st == sharded and unit < 0 and size > 0 for st, unit, size in zip(s.state, s.unit, s.bytes, strict=True)]
    still_whole = sum(size for size, st in zip(s.bytes, s.state, strict=True) if st == whole)
    twice_bytes = sum(full for full, here in zip(tree.bytes, in_call, strict=True) if here)
    if not still_whole and not twice_bytes:
        return None  # nothing held whole: not the engine's sharding that filled the rank
    rows = covering_rows(in_call, [b > 0 for b in tree.bytes], tree.parents)
    peers = tuple(
        PeerHolding(r.rank, r.param_bytes)
        for r in m.ranks
        if r.rank != story.rank and r.oom is None and r.holdings is not None and r.holdings.engine == s.engine
    )
    return SetupTransient(
        oom=OomEvidence.of(story, len(m.ooms)),
        engine_step=str(story.oom.engine_step),
        model_bytes=m.full_bytes,
        world_size=m.world_size,
        whole_bytes=still_whole + twice_bytes,
        shard_bytes=sum(size for size, st in zip(s.bytes, s.state, strict=True) if st == sharded),
        twice=tuple(m.path(row) for row in rows),
        twice_bytes=twice_bytes,
        peers=peers,
        driver=driver_of(m),
    )


def _peers_words(e: SetupTransient) -> str:
    if not e.peers:
        return ""
    held = ", ".join(f"rank {p.rank} holds {fmt(p.param_bytes)}" for p in e.peers)
    return (
        f" Past {e.engine_step}, {held} of the model's {fmt(e.model_bytes)}: the ranks were caught at different "
        "moments of set-up, not given unequal shares."
    )


def explain_setup_transient(e: SetupTransient) -> Explanation:
    o, step = e.oom, e.engine_step
    asked = f", asking for {fmt(o.requested_bytes)}" if o.requested_bytes else ""
    detail = f"Rank {o.rank} ran out of memory on {o.device} in {step} during set-up{asked}."
    if e.twice:
        names = list_names([module_label(p) for p in e.twice])
        detail += (
            f" Its shards snapshot at the OOM shows {step} had sharded {names} ({fmt(e.shard_bytes)} of shards) "
            f"while {fmt(e.whole_bytes - e.twice_bytes)} of the model was still whole; "
            f"{HOLDS_WHAT_IT_WAS_GIVEN[step]}, so {names} ({fmt(e.twice_bytes)}) "
            f"{'was' if len(e.twice) == 1 else 'were'} held twice, whole and sharded."
        )
    else:
        detail += (
            f" Its shards snapshot at the OOM shows {fmt(e.whole_bytes)} of the model still whole"
            + (f" beside {fmt(e.shard_bytes)} of shards" if e.shard_bytes else "")
            + f"; {HOLDS_WHAT_IT_WAS_GIVEN[step]}."
        )
    detail += _peers_words(e)
    if e.driver == "lightning":
        build = (
            'create the layers in configure_model() inside a `torch.device("meta")` context, then call fully_shard '
            "on them there: Lightning's ModelParallelStrategy then allocates each rank's shards and calls each "
            "module's `reset_parameters()`"
        )
    else:
        build = (
            'build the model inside a `torch.device("meta")` context, call fully_shard, then '
            "`model.to_empty(device=...)` and initialise the parameters"
        )
    fix = (
        f"So that no rank ever holds the whole model, {build}. Otherwise set-up needs room for the whole model "
        f"plus the shards of the largest {step} call."
    )
    share = e.model_bytes // max(e.world_size, 1)
    return Explanation(
        title=f"Rank {o.rank} ran out of memory in {step} at set-up, with {fmt(e.whole_bytes)} of the model whole"
        + (f" beside {fmt(e.shard_bytes)} of shards" if e.shard_bytes else ""),
        detail=detail,
        fix=fix,
        severity="error",
        saving_bytes=max(0, e.model_bytes - share),
        modules=e.twice,
    )


SETUP_TRANSIENT = Rule("sharding-transient-at-setup", find_setup_transient, explain_setup_transient)
