"""ZeRO-3 built outside ``zero.Init``, and sharding on a single rank: the whole model where 1/N was expected."""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass
from functools import partial

from shardtop.diagnose.facts import (
    ENGINE_WORDS,
    Driver,
    OomEvidence,
    driver_of,
    first_oom_evidence,
    fmt,
)
from shardtop.diagnose.finding import Evidence, Explanation, Rule
from shardtop.read.run_model import RunModel
from shardtop.read.tree_facts import covering_rows
from shardtop.rundir.engines import FSDP_ENGINES, ZERO3
from shardtop.rundir.events import Shards
from shardtop.words import list_names

OUTSIDE_MIN_SHARE = 0.01
"""Parameters held whole at set-up are worth a finding from 1 % of the model up: a model built
partly outside ``zero.Init`` is flagged for that part, and a stray bias is not."""

PARTITIONED_STATES = frozenset({"sharded", "offloaded", "meta", "persistent", "gathered"})
"""Set-up states that mean a parameter was not built whole outside ``zero.Init``: partitioned
(a ZeRO-3 parameter also held whole for now, persistent or gathered, has its partition too) or
not materialised at all."""

SINGLE_RANK_OOM_SHARE = 0.5
"""On a single rank, a set-up OOM is put down to the unpartitioned model when the model alone
takes at least half of the memory the rank may use; a smaller model leaves the blame elsewhere
(an engine's buffers, say), and the ``oom`` finding names it."""

ACCELERATORS = ("cuda", "xpu", "mps", "hpu", "npu")

HALF_PRECISIONS = {
    "16": "fp16", "16-mixed": "fp16", "16-true": "fp16", "float16": "fp16", "torch.float16": "fp16", "half": "fp16",
    "bf16": "bf16", "bf16-mixed": "bf16", "bf16-true": "bf16", "bfloat16": "bf16", "torch.bfloat16": "bf16",
}
"""Lightning's precision settings and the parameters' dtypes under which DeepSpeed casts the model to half
precision in ``_configure_distributed_model``."""
FULL_PRECISIONS = frozenset({"32", "32-true", "64", "64-true", "float32", "torch.float32", "float64"})
"""Those under which it casts nothing."""


# -- zero3-not-partitioned-at-init ------------------------------------------------------------------


@dataclass(frozen=True)
class BuiltWhole(Evidence):
    world_size: int
    model_bytes: int
    model_params: int
    whole_bytes: int
    """Parameter bytes the fullest rank held whole at set-up (0: no set-up snapshot shows it)."""
    whole_ranks: int
    """Ranks whose set-up snapshot held that part whole."""
    whole_modules: tuple[str, ...]
    """The outermost modules built outside ``zero.Init`` (what the set-up snapshot held whole)."""
    devices: tuple[str, ...]
    """Where those ranks held them."""
    on_gpus: bool
    placed_by_hand: bool
    """Some rank held layers on two or more accelerators at set-up: layers placed by hand."""
    driver: Driver
    oom: OomEvidence | None
    """The OOM while the engine moved or cast the whole model, if one struck there."""
    rehearsed: int = 0
    """Ranks rehearsed, for a rehearsal (0: a real run of every rank)."""
    precision: str = ""
    """``fp16`` or ``bf16`` (the engine casts the model), ``fp32`` (it does not), "" where the run did not say."""
    built_bytes: int = 0
    """Parameter bytes the fullest rank had allocated at all by then (less than the model while it was still
    being built: the rest not yet allocated); 0 where not known."""

    @property
    def building(self) -> bool:
        """The OOM struck while the model itself was being built, before any engine had it."""
        return self.oom is not None and self.oom.engine_step is None

    @property
    def part(self) -> bool:
        """Only part of the model was built outside zero.Init (of what had been built by then)."""
        return 0 < self.whole_bytes < 0.9 * (self.built_bytes or self.model_bytes)


def _whole_rows(m: RunModel, setup: Shards | None) -> list[bool]:
    """Per tree row: the rank held the row's own parameters whole at set-up."""
    if setup is None or not m.aligned(setup):
        return []
    return [
        b > 0 and 0 <= st < len(setup.states) and setup.states[st] not in PARTITIONED_STATES
        for b, st in zip(setup.bytes, setup.state, strict=True)
    ]


def _accelerators(setup: Shards) -> set[str]:
    return {
        setup.devices[d] for d, b in zip(setup.device, setup.bytes, strict=True) if b and 0 <= d < len(setup.devices)
        and setup.devices[d].startswith(ACCELERATORS)
    }


def run_precision(info: Mapping[str, object]) -> str:
    """``fp16``, ``bf16`` or ``fp32`` from what the run said of its precision (Lightning's setting, else the
    parameters' dtype); "" where it said neither."""
    for key in ("precision", "param_dtype"):
        said = str(info.get(key) or "")
        if said in HALF_PRECISIONS:
            return HALF_PRECISIONS[said]
        if said in FULL_PRECISIONS:
            return "fp32"
    return ""


def find_built_whole(m: RunModel) -> BuiltWhole | None:
    if m.engine != ZERO3 or not m.full_bytes or m.tree is None:
        return None
    whole: dict[int, int] = {}
    rows_of: dict[int, list[bool]] = {}
    for r in m.ranks:
        rows = _whole_rows(m, r.setup)
        # rows is [] where the set-up snapshot is of another tree: nothing held whole then.
        held = sum(b for b, w in zip(m.tree.bytes, rows, strict=False) if w)
        if held >= OUTSIDE_MIN_SHARE * m.full_bytes:
            whole[r.rank], rows_of[r.rank] = held, rows
    moving = first_oom_evidence(m, ("setup",))
    if moving is not None and not _moving_or_building(moving):
        moving = None
    if not whole and moving is None:
        return None
    fullest = max(whole, key=whole.__getitem__) if whole else None
    modules: tuple[str, ...] = ()
    devices: tuple[str, ...] = ()
    placed_by_hand = False
    if fullest is not None:
        has = [b > 0 for b in m.tree.bytes]
        modules = tuple(m.path(row) for row in covering_rows(rows_of[fullest], has, m.tree.parents))
        devices = tuple(sorted({d for r in m.ranks if r.rank in whole for d in r.by_device}))
        placed_by_hand = any(r.setup is not None and len(_accelerators(r.setup)) >= 2 for r in m.ranks)
    return BuiltWhole(
        world_size=m.world_size,
        model_bytes=m.full_bytes,
        model_params=m.full_params,
        whole_bytes=whole[fullest] if fullest is not None else 0,
        whole_ranks=len(whole),
        whole_modules=modules,
        devices=devices,
        on_gpus=any(r.device.startswith(ACCELERATORS) for r in m.ranks),
        placed_by_hand=placed_by_hand,
        driver=driver_of(m),
        oom=moving,
        rehearsed=len(m.rehearsal.ranks) if m.rehearsal is not None else 0,
        precision=run_precision(m.info),
        built_bytes=_built_bytes(m, next((r.setup for r in m.ranks if r.rank == fullest), None)),
    )


def _moving_or_building(oom: OomEvidence) -> bool:
    """An OOM while the engine moved or cast the whole model, or while the model was built layer by layer
    outside zero.Init (named by the layer being allocated, no engine step on the stack)."""
    if (oom.engine_step or "").endswith("_configure_distributed_model"):
        return True
    return oom.engine_step is None and oom.module is not None and oom.attributed_by in ("apply-frame", "build-frame")


def _built_bytes(m: RunModel, setup: Shards | None) -> int:
    """Parameter bytes a set-up snapshot shows allocated at all (the rows not on the meta device)."""
    if setup is None or m.tree is None or not m.aligned(setup):
        return 0
    meta = setup.devices.index("meta") if "meta" in setup.devices else -2
    return sum(full for full, d in zip(m.tree.bytes, setup.device, strict=True) if d != meta)


LIGHTNING_INIT = "Lightning calls it inside deepspeed.zero.Init, so each rank only ever allocates its 1/N."
RAW_INIT = (
    "`with deepspeed.zero.Init(config_dict_or_path=ds_config):` before deepspeed.initialize, so each "
    "parameter is partitioned as it is created."
)
NOT_PIPELINING = (
    "It does not put different layers on different GPUs, and layers placed on GPUs by hand are moved to "
    "the rank's own device anyway: that would be pipeline parallelism, which ZeRO-3 is not (and "
    "Lightning's Trainer has no pipeline_parallel_size)."
)


def explain_built_whole(e: BuiltWhole) -> Explanation:
    """The finding, told in sentences: what the ranks held, why, the OOM it caused, what ZeRO-3 does."""
    sentences = [
        _what_was_held(e),
        _why_whole(e),
        _oom_there(e.oom),
        _what_zero3_splits(e.world_size),
        NOT_PIPELINING if e.placed_by_hand else "",
    ]
    held = e.model_bytes if e.building else e.whole_bytes or e.model_bytes
    fix = _built_whole_fix(e)
    ranks = e.world_size  # built under zero.Init each of N ranks holds 1/N
    if ranks < 2:  # on one rank that is all of it: the saving needs a second GPU, and the fix says so
        ranks = 2
        fix += (
            " On one GPU that alone cannot help (zero3-single-rank): on two, each GPU then holds half, "
            f"{fmt(held // 2)} less."
        )
    return Explanation(
        title=_built_whole_title(e),
        detail=" ".join(s for s in sentences if s),
        fix=fix,
        severity="error" if e.oom is not None else "warning",
        saving_bytes=held * (ranks - 1) // ranks,
        modules=(e.oom.module,) if e.oom is not None and e.oom.module else e.whole_modules,
    )


def _built_whole_title(e: BuiltWhole) -> str:
    if e.part:
        return f"{fmt(e.whole_bytes)} of parameters were built outside deepspeed.zero.Init, whole on every rank"
    if e.on_gpus:
        return "DeepSpeed moved the whole model to every GPU before ZeRO-3 partitioned it"
    return f"{'Each rehearsed' if e.rehearsed else 'Every'} rank held the whole model before ZeRO-3 partitioned it"


def _holders(e: BuiltWhole) -> str:
    """Who held the parameters whole: ``2 of 6 ranks``, ``each of the 2 rehearsed ranks (of 6)``."""
    n = e.world_size
    if e.rehearsed == 1:
        return f"the rehearsed rank (of {n})"
    if e.rehearsed:
        each = "each of the" if e.whole_ranks == e.rehearsed else f"{e.whole_ranks} of the"
        return f"{each} {e.rehearsed} rehearsed ranks (of {n})"
    return f"{e.whole_ranks} of {n} ranks" if n > 1 else "the rank"


def _what_was_held(e: BuiltWhole) -> str:
    """What the set-up snapshots held whole, and where; empty where no snapshot shows it."""
    if not e.whole_bytes:
        return ""
    if e.building and not e.part:
        where = f" on {', '.join(e.devices)}" if e.devices else ""
        return (
            f"{_holders(e).capitalize()} built the model whole{where}: each had allocated "
            f"{fmt(e.whole_bytes)} of its {fmt(e.model_bytes)} of parameters, layer after layer, when the "
            "next layer no longer fitted."
        )
    what = "part of the model" if e.part else "the whole model"
    share = (
        f"{e.whole_bytes / e.model_bytes:.0%} of {fmt(e.model_bytes)}" if e.part else f"{e.model_params:,} values"
    )
    where = f", on {', '.join(e.devices)}" if e.devices else ""
    modules = f", in {list_names(e.whole_modules)}" if e.part and e.whole_modules else ""
    return (
        f"Before DeepSpeed partitioned anything, {_holders(e)} held {what}: {fmt(e.whole_bytes)} of parameters "
        f"({share}) unpartitioned{where}{modules}."
    )


def _why_whole(e: BuiltWhole) -> str:
    """Why they were whole: built outside zero.Init, then moved or cast whole by the engine."""
    n = e.world_size
    held = e.model_bytes if e.building else e.whole_bytes or e.model_bytes
    built = (
        "Parameters created outside deepspeed.zero.Init exist"
        if e.part
        else "A model built outside deepspeed.zero.Init exists"
    )
    needs = (
        f"although training only needs 1/{n} of it ({fmt(held // n)})"
        if n > 1
        else "although on N GPUs each would only ever need 1/N of it (on this one GPU, 1/N is all of it: "
        "see zero3-single-rank)"
    )
    per = "GPU" if e.on_gpus else "rank"
    return (
        f"{built} whole on every rank, and {_engine_keeps_it_whole(e)}: set-up needs {fmt(held)} per {per} for "
        f"them {needs}."
    )


def _engine_keeps_it_whole(e: BuiltWhole) -> str:
    """What the engine's set-up does with the whole model in this run's precision, on its devices, before
    ZeRO-3 partitions it."""
    step = "DeepSpeedEngine._configure_distributed_model"
    cast = {"fp16": "casts it to fp16", "bf16": "casts it to bf16"}.get(e.precision, "")
    if e.on_gpus and not e.precision:
        done = f"{step} moves it to the GPU (and casts it, under fp16 or bf16)"
    elif e.on_gpus:
        done = f"{step} moves it to the GPU" + (f" and {cast}" if cast else "")
    elif cast:
        done = f"{step} {cast}"
    else:
        unsaid = "in fp32 on CPU, DeepSpeed's set-up neither moves nor casts it" if e.precision else (
            "DeepSpeed's set-up casts it whole under fp16 or bf16")
        return f"it stays whole until ZeRO-3 partitions it ({unsaid})"
    return f"{done} whole, on every rank, before ZeRO-3 partitions it"


def _oom_there(oom: OomEvidence | None) -> str:
    """The OOM that struck while the engine moved the model, or while the model was built; empty where none
    did."""
    if oom is None:
        return ""
    if oom.engine_step is None:
        others = f" ({oom.ranks_out_of_memory} ranks did)" if oom.ranks_out_of_memory > 1 else ""
        return (f"Rank {oom.rank} ran out of memory allocating `{oom.module}` ({oom.module_type or 'module'})"
                f"{oom.held_words()}{others}, before DeepSpeed had the model at all.")
    what = f", converting `{oom.module}` ({oom.module_type or 'module'})" if oom.module else ""
    others = f" ({oom.ranks_out_of_memory} ranks did)" if oom.ranks_out_of_memory > 1 else ""
    held = oom.held_words()
    if not oom.device.startswith(ACCELERATORS) and oom.limit and not oom.allocated:  # a cap on CPU: RLIMIT_DATA
        held = f", under a cap of {fmt(oom.limit)} more data segment (RLIMIT_DATA)"
    return f"Rank {oom.rank} ran out of memory right there, in {oom.engine_step}{what}{held}{others}."


def _what_zero3_splits(n: int) -> str:
    split = f"{n} ranks: once partitioned, each rank holds 1/{n} of each layer" if n > 1 else "N ranks"
    return f"ZeRO-3 splits every tensor of every layer across all {split}."


def _built_whole_fix(e: BuiltWhole) -> str:
    """Build under zero.Init: Lightning's way, the raw way, or both where the driver is not known."""
    if e.driver == "lightning":
        return _lightning_fix(e)
    if e.driver == "raw":
        return _raw_fix(e, "Build", "Create")
    return f"{_lightning_fix(e)} Without Lightning: {_raw_fix(e, 'build', 'create')}"


def _lightning_fix(e: BuiltWhole) -> str:
    if e.part:
        return f"Create every layer{_named(e)} in configure_model(), not only some: {LIGHTNING_INIT}"
    return f"Build the layers in configure_model() instead of __init__: {LIGHTNING_INIT}"


def _raw_fix(e: BuiltWhole, build: str, create: str) -> str:
    """The fix without Lightning, its first word ``build`` or ``create`` as the sentence needs it."""
    if e.part:
        return f"{create} every parameter{_named(e)} inside the `deepspeed.zero.Init` block: {RAW_INIT}"
    return f"{build} the model under {RAW_INIT}"


def _named(e: BuiltWhole) -> str:
    return f" ({list_names(e.whole_modules)})" if e.whole_modules else ""


BUILT_WHOLE = Rule("zero3-not-partitioned-at-init", find_built_whole, explain_built_whole)


# -- zero3-single-rank / fsdp-single-rank -------------------------------------------------------------


@dataclass(frozen=True)
class SingleRank(Evidence):
    engine: str
    rank_param_bytes: int
    model_bytes: int
    oom: OomEvidence | None
    """A set-up OOM the unpartitioned model explains (None: none, or it does not)."""
    oom_under_zero_init: bool


def find_single_rank(m: RunModel, engines: Collection[str]) -> SingleRank | None:
    """Sharding on one rank with one of ``engines``: ZeRO-3's and FSDP's read alike, each its own rule."""
    if m.world_size != 1 or m.engine not in engines or not m.ranks:
        return None
    r = m.ranks[0]
    oom = first_oom_evidence(m, ("setup",))
    under_init = oom is not None and (oom.engine_step or "").startswith("Init.")
    if oom is not None and not under_init:
        cap = oom.cap
        if not cap or m.full_bytes < SINGLE_RANK_OOM_SHARE * cap:
            oom = None
    return SingleRank(m.engine, r.param_bytes or m.full_bytes, m.full_bytes, oom, under_init)


def explain_single_rank(e: SingleRank) -> Explanation:
    engine = ENGINE_WORDS.get(e.engine, e.engine)
    held = e.rank_param_bytes
    stores = (
        f"this rank stores {fmt(held)} of parameters — the whole model ({fmt(e.model_bytes)}) —"
        if held
        else "this rank holds every parameter whole,"
    )
    detail = (
        f"{engine} runs on a single rank. Partitioning splits each parameter across the ranks; with one rank "
        f"the only partition is the whole tensor, so {stores} plus its gradients and optimizer state, as if "
        f"{engine} were not there."
    )
    oom = e.oom
    if oom is not None and e.oom_under_zero_init:
        detail += (
            f" Rank {oom.rank} ran out of memory in {oom.engine_step}: deepspeed.zero.Init partitions each "
            "parameter as it is created, but on one rank each partition is the whole parameter, so the model "
            "piles up whole on the device."
        )
    elif oom is not None:
        where = f" in {oom.engine_step}" if oom.engine_step else ""
        what = f" ({oom.module})" if oom.module else ""
        size = "is larger than" if e.model_bytes > (oom.cap or 0) else "takes most of"
        detail += (
            f" Rank {oom.rank} ran out of memory during set-up{where}{what}: the whole model "
            f"({fmt(e.model_bytes)}) {size} the {fmt(oom.cap)} the rank may use."
        )
    if e.engine == ZERO3:
        detail += " ZeRO-3 is data parallelism with every tensor split N ways: its saving needs N ≥ 2 GPUs."
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
    return Explanation(
        title=f"{engine} on one rank shards nothing",
        detail=detail,
        fix=f"Run on 2 or more GPUs (`Trainer(devices=N)`, `torchrun --nproc-per-node N`), {more}: each rank then "
        f"holds about 1/N"
        + (f" of the parameters, on two GPUs {fmt(held // 2)} less" if held else "")
        + f". On a single GPU, {offload}.",
        severity="error" if oom is not None else "warning",
        saving_bytes=held // 2 if held else None,  # the fix's two GPUs: each rank holds half the parameters
        modules=(oom.module,) if oom is not None and oom.module else (),
    )


ZERO3_SINGLE_RANK = Rule("zero3-single-rank", partial(find_single_rank, engines=(ZERO3,)), explain_single_rank)
FSDP_SINGLE_RANK = Rule("fsdp-single-rank", partial(find_single_rank, engines=FSDP_ENGINES), explain_single_rank)
