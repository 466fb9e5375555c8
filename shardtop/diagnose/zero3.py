"""ZeRO-3 rules, and sharding on a single rank: the whole model where 1/N was expected.

Each rule takes the run's ``RunFacts`` and returns one ``Finding`` or None.
"""

from __future__ import annotations

from shardtop.diagnose.facts import SHARDED_ENGINES, RunFacts, fmt
from shardtop.diagnose.finding import Finding
from shardtop.events import Oom, Shards

WHOLE_AT_SETUP_SHARE = 0.9
"""A rank "held the whole model at set-up" when at least 90 % of the parameter bytes were
stored unpartitioned on it (rounding and a few persistent parameters aside)."""

PARTITIONED_STATES = frozenset({"sharded", "offloaded", "meta"})
"""Set-up states that mean the model was not materialised whole on the rank."""

SINGLE_RANK_OOM_SHARE = 0.5
"""On a single rank, a set-up OOM is put down to the unpartitioned model when the model alone
takes at least half of the memory the rank may use; a smaller model leaves the blame elsewhere
(an engine's buffers, say), and the ``oom`` finding names it."""

ENGINE_WORDS = {"fsdp1": "FSDP", "fsdp2": "FSDP2 (fully_shard)", "zero3": "DeepSpeed ZeRO-3"}


def _explained_on_one_rank(f: RunFacts, oom: Oom) -> str:
    """Why a set-up OOM on a lone sharding rank is the unpartitioned model's doing ("" if it is not).

    ``zero.Init`` "partitions" each parameter as it is made, and on one rank the
    partition is the whole parameter; otherwise the whole model must take at least
    ``SINGLE_RANK_OOM_SHARE`` of the memory the rank may use.
    """
    if (oom.engine_step or "").startswith("Init."):
        return (
            f" Rank {oom.rank} ran out of memory in {oom.engine_step}: deepspeed.zero.Init partitions each "
            "parameter as it is created, but on one rank each partition is the whole parameter, so the model "
            "piles up whole on the device."
        )
    cap = oom.limit or oom.total
    if cap and f.full_bytes >= SINGLE_RANK_OOM_SHARE * cap:
        where = f" in {oom.engine_step}" if oom.engine_step else ""
        what = f" ({oom.module})" if oom.module else ""
        size = "is larger than" if f.full_bytes > cap else "takes most of"
        return (
            f" Rank {oom.rank} ran out of memory during set-up{where}{what}: the whole model "
            f"({fmt(f.full_bytes)}) {size} the {fmt(cap)} the rank may use."
        )
    return ""


def single_rank(f: RunFacts) -> Finding | None:
    """ZeRO-3 or FSDP on one rank partitions nothing: the rank holds the whole model."""
    if f.world_size != 1 or f.engine not in SHARDED_ENGINES or not f.ranks:
        return None
    r = f.ranks[0]
    held = r.param_bytes or f.full_bytes
    engine = ENGINE_WORDS.get(f.engine, f.engine)
    code = "zero3-single-rank" if f.engine == "zero3" else "fsdp-single-rank"
    stores = (
        f"this rank stores {fmt(held)} of parameters — the whole model ({fmt(f.full_bytes)}) —"
        if held
        else "this rank holds every parameter whole,"
    )
    detail = (
        f"{engine} runs on a single rank. Partitioning splits each parameter across the ranks; with one rank "
        f"the only partition is the whole tensor, so {stores} plus its gradients and optimizer state, as if "
        f"{engine} were not there."
    )
    oom = next((o for o in f.ooms if o.phase == "setup"), None)
    explained = _explained_on_one_rank(f, oom) if oom is not None else ""
    detail += explained
    if f.engine == "zero3":
        detail += (
            " ZeRO-3 never places layers on other GPUs either: it is data parallelism with every tensor split "
            "N ways, so its saving needs N ≥ 2 GPUs."
        )
        more = (
            "with the layers built in configure_model() (Lightning) or under deepspeed.zero.Init, so no rank "
            "ever holds the whole model"
        )
        offload = (
            "offload instead: `offload_param`/`offload_optimizer` to cpu "
            '(Lightning: `strategy="deepspeed_stage_3_offload"`)'
        )
    else:
        more = "with an auto-wrap policy on the repeated block"
        offload = "offload instead: `CPUOffload(offload_params=True)` (FSDP2: `CPUOffloadPolicy()`)"
    return Finding(
        code=code,
        title=f"{engine} on one rank shards nothing",
        detail=detail,
        fix=f"Run on 2 or more GPUs (`Trainer(devices=N)`, `torchrun --nproc-per-node N`), {more}: each rank then "
        f"holds about 1/N. On a single GPU, {offload}.",
        severity="error" if explained else "warning",
        saving_bytes=held // 2 if held else None,
        modules=(oom.module,) if explained and oom is not None and oom.module else (),
        evidence={"world_size": 1, "rank_param_bytes": held, "model_bytes": f.full_bytes, "saving_with_ranks": 2},
    )


def _whole_at_setup(f: RunFacts, setup: Shards | None) -> int:
    """Bytes of the model the rank held unpartitioned at set-up (0 if it was partitioned)."""
    if setup is None or setup.info.get("zero_init") or not f.aligned(setup):
        return 0
    whole = sum(
        b
        for b, st in zip(setup.bytes, setup.state)
        if b and 0 <= st < len(setup.states) and setup.states[st] not in PARTITIONED_STATES
    )
    return whole if whole >= WHOLE_AT_SETUP_SHARE * f.full_bytes else 0


def zero3_not_partitioned_at_init(f: RunFacts) -> Finding | None:
    """The whole model materialised on every rank before ZeRO-3 partitioned it (story 2)."""
    if f.engine != "zero3" or not f.full_bytes:
        return None
    whole = {r.rank: _whole_at_setup(f, r.setup) for r in f.ranks}
    whole = {rank: b for rank, b in whole.items() if b}
    moving = [
        o for o in f.ooms if o.phase == "setup" and (o.engine_step or "").endswith("_configure_distributed_model")
    ]
    if not whole and not moving:
        return None
    n = f.world_size
    devices = sorted({d for r in f.ranks if r.rank in whole for d in r.by_device})
    held = max(whole.values()) if whole else f.full_bytes
    detail = (
        (
            f"Before DeepSpeed partitioned anything, {f'{len(whole)} of {n} ranks' if n > 1 else 'the rank'} "
            "held the whole model: "
            f"{fmt(held)} of parameters ({f.full_params:,} values), unpartitioned"
            + (f", on {', '.join(devices)}" if devices else "")
            + ". "
        )
        if whole
        else ""
    )
    on_gpus = any(r.device.startswith("cuda") for r in f.ranks)
    device = "GPU" if on_gpus else "rank"
    what = (
        "moves it to the GPU (and casts it to fp16/bf16)"
        if on_gpus
        else "casts it to fp16/bf16 (on GPUs: moves it to the GPU)"
    )
    needs = (
        f"although training only needs 1/{n} of it ({fmt(f.full_bytes // n)})"
        if n > 1
        else "although on N GPUs each would only ever need 1/N of it (on this one GPU, 1/N is all of it: "
        "see zero3-single-rank)"
    )
    detail += (
        "A model built outside deepspeed.zero.Init exists whole on every rank, and "
        f"DeepSpeedEngine._configure_distributed_model {what} whole, on every rank, before ZeRO-3 partitions it: "
        f"set-up needs the whole model per {device} ({fmt(f.full_bytes)}) {needs}."
    )
    oom = moving[0] if moving else None
    if oom is not None:
        what = f", converting `{oom.module}` ({oom.module_type or 'module'})" if oom.module else ""
        asked = f", asking for {fmt(oom.requested_bytes)}" if oom.requested_bytes else ""
        had = f" with {fmt(oom.allocated)} already allocated" if oom.allocated else ""
        cap = f" of a {fmt(oom.limit)} limit" if oom.limit else ""
        detail += f" Rank {oom.rank} ran out of memory right there, in {oom.engine_step}{what}{asked}{had}{cap}" + (
            f" ({len(moving)} ranks did)." if len(moving) > 1 else "."
        )
    detail += (
        " ZeRO-3 does not put different layers on different GPUs — that would be pipeline parallelism, and "
        "Lightning's Trainer has no pipeline_parallel_size. It splits every tensor of every layer across all "
        + (f"{n} ranks: once partitioned, each rank holds 1/{n} of each layer." if n > 1
           else "N ranks: once partitioned, each rank holds 1/N of each layer.")
    )
    lightning_fix = (
        "Build the layers in configure_model() instead of __init__: Lightning calls it inside "
        "deepspeed.zero.Init, so each rank only ever allocates its 1/N."
    )
    raw_fix = (
        "Build the model under `with deepspeed.zero.Init(config_dict_or_path=ds_config):` before "
        "deepspeed.initialize, so each parameter is partitioned as it is created."
    )
    if f.lightning:
        fix = lightning_fix
    elif f.driver:
        fix = raw_fix
    else:
        fix = f"{lightning_fix} Without Lightning: {raw_fix[0].lower()}{raw_fix[1:]}"
    return Finding(
        code="zero3-not-partitioned-at-init",
        title="DeepSpeed moved the whole model to every GPU before ZeRO-3 partitioned it"
        if on_gpus
        else "Every rank held the whole model before ZeRO-3 partitioned it",
        detail=detail,
        fix=fix,
        severity="error" if oom is not None else "warning",
        saving_bytes=f.full_bytes * (max(n, 2) - 1) // max(n, 2),  # on one GPU: what a second would save
        modules=(oom.module,) if oom is not None and oom.module else (),
        evidence={
            "world_size": n,
            "saving_with_ranks": max(n, 2),
            "model_bytes": f.full_bytes,
            "whole_at_setup_ranks": len(whole),
            "setup_bytes_per_rank": held,
            **({"oom_rank": oom.rank, "engine_step": oom.engine_step or ""} if oom is not None else {}),
        },
    )
