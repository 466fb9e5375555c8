"""An optimizer built before the model was wrapped: it holds the original parameters, which the
engine replaced (FSDP1 flattens them into FlatParameters, FSDP2 swaps in sharded DTensors).

The optimizer then steps tensors no forward uses, the engine's own parameters are never
updated, and the originals stay alive, whole, on every rank.  The probe counts the optimizer's
tensors that are none of the engine's parameters but have the size of one of the model's
(``Shards.info``: ``stale_optimizer_params``, ``_numel``, ``_bytes``; see
``probe/shards/stale_optim.py``).  DDP keeps the model's parameters, so there the order does
not matter and nothing is found.
"""

from __future__ import annotations

from dataclasses import dataclass

from shardtop.diagnose.facts import ENGINE_WORDS, Driver, driver_of, fmt
from shardtop.diagnose.finding import Evidence, Explanation, Rule
from shardtop.read.run_model import RunModel
from shardtop.rundir.engines import DDP, FSDP1, FSDP2

WRAPPING = {
    FSDP1: "FSDP wrapped the model, which flattened its parameters into FlatParameters",
    FSDP2: "fully_shard replaced its parameters with sharded DTensors",
    DDP: "DDP wrapped the model",
}


@dataclass(frozen=True)
class OptimizerBeforeWrap(Evidence):
    engine: str
    rank: int
    stale_params: int
    """Optimizer tensors the size of one of the model's parameters that are not the engine's."""
    stale_numel: int
    stale_bytes: int
    """Bytes of storage those tensors keep alive on the rank."""
    optimizer_params: int
    """Every tensor the optimizer holds."""
    world_size: int
    driver: Driver


def find_optimizer_before_wrap(m: RunModel) -> OptimizerBeforeWrap | None:
    if m.engine not in WRAPPING:
        return None
    worst: OptimizerBeforeWrap | None = None
    for r in m.engine_ranks:
        assert r.shards is not None
        info = r.shards.info
        stale, held = info.get("stale_optimizer_params"), info.get("optimizer_params")
        if not isinstance(stale, int) or not isinstance(held, int) or stale <= 0:
            continue
        found = OptimizerBeforeWrap(
            engine=m.engine,
            rank=r.rank,
            stale_params=stale,
            stale_numel=int(info.get("stale_optimizer_numel") or 0),
            stale_bytes=int(info.get("stale_optimizer_bytes") or 0),
            optimizer_params=held,
            world_size=m.world_size,
            driver=driver_of(m),
        )
        if worst is None or found.stale_bytes > worst.stale_bytes:
            worst = found
    return worst


def explain_optimizer_before_wrap(e: OptimizerBeforeWrap) -> Explanation:
    engine = ENGINE_WORDS.get(e.engine, e.engine)
    every = e.stale_params == e.optimizer_params
    detail = (
        f"On rank {e.rank} the optimizer holds {e.stale_params} tensor(s) ({e.stale_numel:,} values) that are not "
        f"the parameters {engine} trains: it was built from the model's parameters before {WRAPPING[e.engine]}. "
        "Those tensors take part in no forward, so their gradients stay empty and stepping them changes nothing "
        + ("the model uses: the model is not trained at all. " if every
           else f"the model uses ({e.stale_params} of the optimizer's {e.optimizer_params} tensors). ")
    )
    if e.stale_bytes:
        detail += f"They keep their full storage alive: {fmt(e.stale_bytes)} on the rank, whole, next to its shards."
    if e.driver == "lightning":
        fix = (
            "Create the optimizer in configure_optimizers() from self.parameters(): Lightning calls it after the "
            "strategy has wrapped the model."
        )
    elif e.engine == FSDP2:
        fix = (
            "Build the optimizer after fully_shard: `fully_shard(model)`, "
            "then `optimizer = torch.optim.AdamW(model.parameters(), ...)`."
        )
    elif e.engine == FSDP1:
        fix = (
            "Build the optimizer after wrapping: `model = FSDP(model, ...)`, "
            "then `optimizer = torch.optim.AdamW(model.parameters(), ...)`."
        )
    else:
        fix = "Build the optimizer from the wrapped model's parameters, after wrapping it."
    return Explanation(
        title=f"The optimizer was built before {engine} wrapped the model: it steps {e.stale_params} stale tensor(s)",
        detail=detail,
        fix=fix,
        severity="warning",
        saving_bytes=e.stale_bytes or None,
    )


OPTIMIZER_BEFORE_WRAP = Rule("optimizer-before-wrap", find_optimizer_before_wrap, explain_optimizer_before_wrap)
