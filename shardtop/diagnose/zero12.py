"""ZeRO-1/2 where the parameters, which they keep whole on every rank, outweigh everything they
do split (optimizer state, and under ZeRO-2 gradients): ZeRO-3 or FSDP would shard them too.

Typical of fine-tuning: a large frozen model has no optimizer state and no gradients, so ZeRO-2
splits almost nothing while every rank holds the whole model.
"""

from __future__ import annotations

from dataclasses import dataclass

from shardtop.diagnose.facts import ENGINE_WORDS, Driver, driver_of, fmt
from shardtop.diagnose.finding import Evidence, Explanation, Rule
from shardtop.read.run_model import RunModel
from shardtop.rundir.engines import ZERO1, ZERO2

REPLICATED_MIN_BYTES = 8 << 20
"""Sharding the parameters is worth a finding when it frees at least 8 MiB per rank."""


@dataclass(frozen=True)
class ReplicatedParams(Evidence):
    engine: str
    stage: int
    data_parallel_size: int
    rank: int
    param_bytes: int
    """Parameter bytes the rank holds, whole."""
    frozen_bytes: int
    """Of those, the parameters in no optimizer partition (frozen)."""
    grad_bytes: int
    grads_recorded: bool
    """False: no gradient was recorded, and ``grad_bytes`` is what ZeRO keeps of the trainable
    parameters' gradients (ZeRO-2: their partition, ZeRO-1: all of them)."""
    optimizer_bytes: int
    model_bytes: int
    driver: Driver

    @property
    def split_bytes(self) -> int:
        """What ZeRO partitions on this rank: optimizer state and gradients."""
        return self.optimizer_bytes + self.grad_bytes

    @property
    def freed_bytes(self) -> int:
        n = max(self.data_parallel_size, 1)
        return self.param_bytes - self.param_bytes // n


def find_replicated_params(m: RunModel) -> ReplicatedParams | None:
    if m.engine not in (ZERO1, ZERO2):
        return None
    r = next((r for r in m.engine_ranks if m.aligned(r.shards)), None)
    if r is None or r.shards is None or r.optim_bytes is None:
        return None
    s = r.shards
    dp = s.info.get("data_parallel_size")
    if not isinstance(dp, int) or dp < 2:
        return None
    stage = 2 if m.engine == ZERO2 else 1
    frozen = sum(b for b, u in zip(s.bytes, s.unit, strict=True) if u < 0)
    trainable = r.param_bytes - frozen
    grads = r.grad_bytes if r.grad_bytes is not None else (trainable // dp if stage == 2 else trainable)
    found = ReplicatedParams(
        engine=m.engine,
        stage=stage,
        data_parallel_size=dp,
        rank=r.rank,
        param_bytes=r.param_bytes,
        frozen_bytes=frozen,
        grad_bytes=grads,
        grads_recorded=r.grad_bytes is not None,
        optimizer_bytes=r.optim_bytes,
        model_bytes=m.full_bytes,
        driver=driver_of(m),
    )
    if found.param_bytes < found.split_bytes or found.freed_bytes < REPLICATED_MIN_BYTES:
        return None
    return found


def explain_replicated_params(e: ReplicatedParams) -> Explanation:
    n = e.data_parallel_size
    engine = ENGINE_WORDS[e.engine]
    split = "optimizer state and gradients" if e.stage == 2 else "optimizer state"
    frozen = (
        f", {fmt(e.frozen_bytes)} of them frozen (no optimizer state, no gradient: nothing for ZeRO to split)"
        if e.frozen_bytes
        else ""
    )
    grads = "" if e.grads_recorded else " (gradients estimated: none was recorded)"
    detail = (
        f"{engine} splits {split} over the {n} ranks but keeps every parameter whole on every rank. Rank {e.rank} "
        f"holds {fmt(e.param_bytes)} of parameters{frozen}, against {fmt(e.optimizer_bytes)} of optimizer state "
        f"and {fmt(e.grad_bytes)} of gradients{grads}: the parameters, replicated, are the larger part. Sharded "
        f"too, they would take {fmt(e.param_bytes // n)} per rank."
    )
    lightning = e.driver == "lightning"
    fix = (
        "Shard the parameters as well: ZeRO-3 ("
        + ('`strategy="deepspeed_stage_3"`, with the layers built in configure_model()' if lightning
           else '`"zero_optimization": {"stage": 3}`, with the model built under `deepspeed.zero.Init`')
        + "), or FSDP. Each rank then holds 1/N of every parameter, frozen ones included, for an all-gather per "
        "layer in forward and backward."
    )
    return Explanation(
        title=f"{engine} keeps {fmt(e.param_bytes)} of parameters whole on every rank, more than all it splits",
        detail=detail,
        fix=fix,
        severity="info",
        saving_bytes=e.freed_bytes,
    )


REPLICATED_PARAMS = Rule("zero12-replicated-params", find_replicated_params, explain_replicated_params)
