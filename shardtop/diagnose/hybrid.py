"""HYBRID_SHARD: FSDP shards each unit only within a shard group (by default a node) and keeps
one copy per group, so each rank holds 1/S of the model, not 1/N.

That is a trade (less traffic between nodes for more memory per rank), so the finding is
``info``; with shard groups of one rank nothing is sharded at all, which is a ``warning``.
"""

from __future__ import annotations

from dataclasses import dataclass

from shardtop.diagnose.facts import ENGINE_WORDS, Driver, driver_of, fmt
from shardtop.diagnose.finding import Evidence, Explanation, Rule
from shardtop.read.run_model import RunModel
from shardtop.rundir.engines import FSDP2, FSDP_ENGINES


@dataclass(frozen=True)
class HybridShard(Evidence):
    engine: str
    strategy: str
    shard_group_size: int
    replicate_group_size: int
    world_size: int
    hosts: int
    """Hosts the ranks ran on (0: not known, a rehearsal's ranks all ran on one device)."""
    ranks_per_host: int
    """Ranks on the fullest host (0: not known)."""
    rank: int
    rank_param_bytes: int
    model_bytes: int
    driver: Driver

    @property
    def full_shard_bytes(self) -> int:
        """What the rank would hold sharded over every rank."""
        return self.rank_param_bytes * self.shard_group_size // max(self.world_size, 1)


def find_hybrid_shard(m: RunModel) -> HybridShard | None:
    if m.engine not in FSDP_ENGINES or m.world_size < 2:
        return None
    r = m.first_engine_rank()
    if r is None or r.shards is None:
        return None
    info = r.shards.info
    shard, replicate = info.get("shard_group_size"), info.get("replicate_group_size")
    if not isinstance(shard, int) or not isinstance(replicate, int) or replicate < 2 or shard < 1:
        return None
    per_host: dict[str, int] = {}
    for rank in m.ranks if m.rehearsal is None else ():  # a rehearsal does not say how the job spreads
        per_host[rank.host] = per_host.get(rank.host, 0) + 1
    return HybridShard(
        engine=m.engine,
        strategy=str(info.get("sharding_strategy") or "HYBRID_SHARD"),
        shard_group_size=shard,
        replicate_group_size=replicate,
        world_size=m.world_size,
        hosts=len(per_host),
        ranks_per_host=max(per_host.values(), default=0),
        rank=r.rank,
        rank_param_bytes=r.param_bytes,
        model_bytes=m.full_bytes,
        driver=driver_of(m),
    )


def explain_hybrid_shard(e: HybridShard) -> Explanation:
    s, n, rep = e.shard_group_size, e.world_size, e.replicate_group_size
    engine = ENGINE_WORDS.get(e.engine, e.engine)
    detail = (
        f"{engine} shards each unit over groups of {s} rank(s) and keeps {rep} copies of it, one per group "
        f"({e.strategy}, {rep} × {s} = {rep * s} ranks): rank {e.rank} holds {fmt(e.rank_param_bytes)} of "
        f"parameters, 1/{s} of the model's {fmt(e.model_bytes)}, where sharding over all {n} ranks would leave "
        f"about {fmt(e.full_shard_bytes)}."
    )
    if s == 1:
        detail += " With shard groups of one rank nothing is sharded: every rank holds the whole model, as under DDP."
    elif e.hosts > 1 and s == e.ranks_per_host:
        detail += " Each shard group is one node: only gradients cross nodes, which is what HYBRID_SHARD is for."
    if e.engine == FSDP2:
        fix = (
            f"To shard over every rank, give fully_shard a 1-D mesh: `init_device_mesh(device_type, ({n},))`; or a "
            f"2-D (replicate, shard) mesh with a larger shard dimension. Each rank then holds 1/{n} (or 1/shard) of "
            "the model, at the cost of all-gathers across nodes."
        )
    else:
        strategy = (
            'FSDPStrategy(sharding_strategy="FULL_SHARD")'
            if e.driver == "lightning"
            else "sharding_strategy=ShardingStrategy.FULL_SHARD"
        )
        fix = (
            f"To shard over every rank: `{strategy}`, or a device_mesh (replicate, shard) with a larger shard "
            f"dimension. Each rank then holds 1/{n} (or 1/shard) of the model, at the cost of all-gathers across nodes."
        )
    return Explanation(
        title=(
            f"{e.strategy} with shard groups of one rank shards nothing: each rank holds the whole model"
            if s == 1
            else f"Each rank holds 1/{s} of the model, not 1/{n}: {e.strategy} shards only within groups of {s}"
        ),
        detail=detail,
        fix=fix,
        severity="warning" if s == 1 else "info",
        saving_bytes=max(0, e.rank_param_bytes - e.full_shard_bytes),
    )


HYBRID_SHARD = Rule("fsdp-hybrid-shard", find_hybrid_shard, explain_hybrid_shard)
