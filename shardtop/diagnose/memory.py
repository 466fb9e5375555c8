"""Optimizer state that outweighs the model, and the OOM itself when nothing else explains it."""

from __future__ import annotations

from shardtop.diagnose.facts import RankFacts, RunFacts, fmt
from shardtop.diagnose.finding import Finding
from shardtop.events import ATTRIBUTED_BY_WORDS, Oom

OPTIM_STATE_RATIO = 0.95
"""Optimizer state "dominates" when it is at least as large as parameters + gradients
(with 5 % slack for step counters and padding): Adam's two fp32 moments equal fp32
parameters + gradients exactly, and exceed them under mixed precision; SGD's momentum is
half of that and stays out."""

OPTIM_MIN_BYTES = 16 << 20
"""Optimizer state under 16 MiB per rank is not worth a finding."""

OPTIMIZER_SHARDING_ENGINES = frozenset({"zero1", "zero2", "zero3", "fsdp1", "fsdp2"})
"""Engines that partition optimizer state across the data-parallel ranks."""


def optimizer_state_dominates(f: RunFacts) -> Finding | None:
    """Optimizer state at least as large as parameters + gradients on some rank."""
    worst: tuple[RankFacts, int, int] | None = None
    for r in f.ranks:
        if r.optim_bytes is None or r.optim_bytes < OPTIM_MIN_BYTES:
            continue
        grads = r.grad_bytes if r.grad_bytes is not None else r.param_bytes
        if r.optim_bytes >= OPTIM_STATE_RATIO * (r.param_bytes + grads):
            if worst is None or r.optim_bytes > worst[0].optim_bytes:  # type: ignore[operator]
                worst = (r, r.optim_bytes, grads)
    if worst is None:
        return None
    r, optim, grads = worst
    n = max(f.world_size, 1)
    dp = f.info.get("data_parallel_size", n)
    sharded = f.engine in OPTIMIZER_SHARDING_ENGINES and isinstance(dp, int) and dp > 1
    name = str(f.info.get("optimizer") or "")
    detail = (
        f"Rank {r.rank} keeps {fmt(optim)} of optimizer state{f' ({name})' if name else ''} — as much as or more "
        f"than its parameters ({fmt(r.param_bytes)}) and gradients ({fmt(grads)}"
        + (", counted as the size of the parameters: none recorded yet" if r.grad_bytes is None else "")
        + ") together. Adam and AdamW keep two fp32 moments per parameter, "
        "and an fp32 master copy under mixed precision."
    )
    if sharded:
        detail += f" It is already sharded over {dp} ranks."
        fix = (
            "To shrink it further: offload it to CPU (DeepSpeed `offload_optimizer: {device: cpu}`, FSDP "
            "`CPUOffload(offload_params=True)`), or a lighter optimizer (SGD with momentum keeps one copy, "
            "8-bit Adam a quarter)."
        )
        saving, severity = optim // 2, "info"
    elif n > 1:
        detail += f" It is replicated: each of the {n} ranks holds the same full copy."
        fix = (
            f'Shard it across the {n} ranks: DeepSpeed ZeRO-1/2 (Lightning `strategy="deepspeed_stage_2"`) or '
            "FSDP, which shard optimizer state with the parameters; or use a lighter optimizer."
        )
        saving, severity = optim * (n - 1) // n, "warning"
    else:
        fix = (
            "A lighter optimizer (SGD with momentum keeps one copy, 8-bit Adam a quarter), or offload it to CPU "
            "(DeepSpeed `offload_optimizer`); with more GPUs, shard it (ZeRO-1/2, FSDP)."
        )
        saving, severity = optim // 2, "info"
    return Finding(
        code="optimizer-state-dominates",
        title=f"Optimizer state ({fmt(optim)} per rank) "
        + (
            f"outweighs parameters and gradients {optim / max(r.param_bytes + grads, 1):.1f}×"
            if optim >= 1.1 * (r.param_bytes + grads)
            else "weighs as much as parameters and gradients together"
        ),
        detail=detail,
        fix=fix,
        severity=severity,
        saving_bytes=saving,
        evidence={
            "rank": r.rank,
            "optimizer_bytes": optim,
            "param_bytes": r.param_bytes,
            "grad_bytes": grads,
            "sharded": int(sharded),
        },
    )



REDUCE_BUCKET_BYTES = 500_000_000 * 4
"""DeepSpeed's default ``reduce_bucket_size`` (5e8 elements) in fp32."""


def _oom_fix(f: RunFacts, o: Oom) -> str:
    step = o.engine_step or ""
    block = f.block.type_name if f.block else "each block"
    if step.endswith("_configure_zero_optimizer"):
        bucket = (
            " The request matches DeepSpeed's default reduce bucket "
            f"(5e8 elements, {fmt(REDUCE_BUCKET_BYTES)} in fp32)."
            if o.requested_bytes == REDUCE_BUCKET_BYTES
            else ""
        )
        return (
            "DeepSpeed allocates ZeRO's communication buckets and fp32 optimizer partitions here. Lower "
            "`reduce_bucket_size`, `allgather_bucket_size` and `stage3_prefetch_bucket_size` in `zero_optimization` "
            "(e.g. 5e7), or offload the optimizer (`offload_optimizer: {device: cpu}`)." + bucket
        )
    if o.phase in ("forward", "backward", "validation"):
        return (
            "Activations did not fit (plus, under FSDP/ZeRO-3, the gathered parameters of the running unit): use a "
            f"smaller micro-batch or sequence length, activation checkpointing on {block}, or shard more of the model."
        )
    if o.phase == "optimizer":
        return (
            "The optimizer creates its state at the first step (Adam: twice the parameters, in fp32): shard it "
            "(ZeRO-1/2, FSDP), offload it to CPU, or use a lighter optimizer."
        )
    if o.phase == "setup":
        return (
            "The model or the engine's buffers did not fit at set-up: shard the model (FSDP with an auto-wrap "
            "policy; ZeRO-3 with the layers built in configure_model() or under deepspeed.zero.Init), or offload."
        )
    return "Reduce what this phase allocates (batch size, buffers), or shard or offload more of the model."


def oom_finding(f: RunFacts) -> Finding:
    """The first OOM itself: where, in which step, asking for how much, with what held."""
    o = f.ooms[0]
    where = f" in `{o.module}`" if o.module else ""
    detail = f"Rank {o.rank} ran out of memory on {o.device} during {o.phase}" + (f" (step {o.step})" if o.step else "")
    detail += where + (f" ({o.module_type})" if o.module and o.module_type else "")
    if o.module:
        detail += f": {ATTRIBUTED_BY_WORDS.get(o.attributed_by, o.attributed_by)}"
    detail += "."
    if o.engine_step:
        detail += f" The engine was in {o.engine_step}."
    held = [
        f"asked for {fmt(o.requested_bytes)}" if o.requested_bytes else "",
        f"{fmt(o.allocated)} already allocated" if o.allocated else "",
        f"{fmt(o.reserved)} reserved" if o.reserved else "",
        f"a limit of {fmt(o.limit)}" if o.limit else "",
    ]
    if any(held):
        detail += " It " + ", ".join(h for h in held if h) + "."
    others = [x for x in f.ooms[1:]]
    if others:
        detail += (
            " Also out of memory: "
            + ", ".join(f"rank {x.rank} during {x.phase}" + (f" in {x.module}" if x.module else "") for x in others)
            + "."
        )
    return Finding(
        code="oom",
        title=f"Rank {o.rank} ran out of memory during {o.phase}{where}",
        detail=detail,
        fix=_oom_fix(f, o),
        severity="error",
        modules=(o.module,) if o.module else (),
        evidence={
            "rank": o.rank,
            "phase": o.phase,
            "step": o.step,
            "engine_step": o.engine_step or "",
            "requested_bytes": o.requested_bytes or 0,
            "ranks_out_of_memory": len(f.ooms),
        },
    )
