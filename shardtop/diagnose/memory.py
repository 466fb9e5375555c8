"""Optimizer state that outweighs the model, the OOM itself when nothing else explains it, and a
run that recorded nothing."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from shardtop.diagnose.facts import (
    ENGINE_WORDS,
    KindsEvidence,
    OomEvidence,
    fmt,
)
from shardtop.diagnose.finding import Evidence, Explanation, Rule, Severity
from shardtop.diagnose.oom_fix import LIGHTER_OPTIMIZER, OutOfMemory, held_at_oom, offload_words, oom_fix
from shardtop.read.run_model import RunModel
from shardtop.rundir.engines import OPTIMIZER_SHARDING_ENGINES
from shardtop.words import module_label

OPTIM_STATE_RATIO = 0.95
"""Optimizer state "dominates" when it is at least as large as parameters + gradients
(with 5 % slack for step counters and padding): Adam's two fp32 moments equal fp32
parameters + gradients exactly, and exceed them under mixed precision; SGD's momentum is
half of that and stays out."""

OPTIM_MIN_BYTES = 16 << 20
"""Optimizer state under 16 MiB per rank is not worth a finding."""



# -- optimizer-state-dominates ------------------------------------------------------------------


@dataclass(frozen=True)
class OptimizerHeavy(Evidence):
    engine: str
    world_size: int
    data_parallel_size: int
    rank: int
    optimizer: str
    optimizer_bytes: int
    param_bytes: int
    grad_bytes: int
    grads_recorded: bool
    """False: no gradient bytes were recorded yet, and the parameters' size stands in for them."""
    device: str = ""
    """The rank's device: optimizer state offloaded from a GPU leaves it; a CPU rank has nowhere to put it."""
    offloaded: bool = False
    """The engine already offloads the optimizer state (DeepSpeed ``offload_optimizer``, FSDP CPU offload)."""

    @property
    def can_offload(self) -> bool:
        return self.device.startswith("cuda") and not self.offloaded


def _offloads_optimizer(info: Mapping[str, object]) -> bool:
    return info.get("offload_optimizer") not in (None, "", "none") or info.get("offload") is True


def find_optimizer_heavy(m: RunModel) -> OptimizerHeavy | None:
    worst = None
    for r in m.ranks:
        if r.optim_bytes is None or r.optim_bytes < OPTIM_MIN_BYTES:
            continue
        grads = r.grad_bytes if r.grad_bytes is not None else r.param_bytes
        if r.optim_bytes >= OPTIM_STATE_RATIO * (r.param_bytes + grads) and (worst is None or r.optim_bytes > worst[1]):
            worst = (r, r.optim_bytes, grads)
    if worst is None:
        return None
    r, optim, grads = worst
    n = max(m.world_size, 1)
    dp = m.info.get("data_parallel_size", n)
    return OptimizerHeavy(
        engine=m.engine,
        world_size=n,
        data_parallel_size=dp if isinstance(dp, int) else n,
        rank=r.rank,
        optimizer=str(m.info.get("optimizer") or ""),
        optimizer_bytes=optim,
        param_bytes=r.param_bytes,
        grad_bytes=grads,
        grads_recorded=r.grad_bytes is not None,
        device=r.device,
        offloaded=_offloads_optimizer(m.info),
    )


def _optimizer_fix(e: OptimizerHeavy, shards_it: bool) -> tuple[str, int | None]:
    """The fix in words, and the bytes per rank it saves: computed for the first change the words name, or
    None where that change's saving does not follow from the evidence (more GPUs than the run had, a lighter
    optimizer whose state depends on the precision)."""
    engine = ENGINE_WORDS.get(e.engine, e.engine)
    if not shards_it and e.world_size > 1:
        saving = e.optimizer_bytes * (e.world_size - 1) // e.world_size
        return (
            f'Shard it across the {e.world_size} ranks: DeepSpeed ZeRO-1/2 (Lightning `strategy="deepspeed_stage_2"`) '
            f"or FSDP, which shard optimizer state with the parameters: each rank then keeps 1/{e.world_size} of it, "
            f"{fmt(saving)} less. Or use {LIGHTER_OPTIMIZER}.",
            saving,
        )
    more = f"run on more GPUs ({engine} then splits it N ways)" if shards_it and e.data_parallel_size <= 1 else ""
    options = [o for o in (more, f"use {LIGHTER_OPTIMIZER}") if o]
    if not e.can_offload:
        said = " or ".join(options)
        if e.offloaded:
            said += " (it is offloaded to the CPU already)"
        elif e.device.startswith("cpu"):
            said += " (the rank runs on the CPU: there is nowhere to offload it to)"
        return f"{said[:1].upper()}{said[1:]}.", None
    return (
        f"Offload it to CPU ({offload_words(e.engine)}): its {fmt(e.optimizer_bytes)} then leave the GPU. "
        f"Or {', or '.join(options)}.",
        e.optimizer_bytes,
    )


def explain_optimizer_heavy(e: OptimizerHeavy) -> Explanation:
    name = f" ({e.optimizer})" if e.optimizer else ""
    detail = (
        f"Rank {e.rank} keeps {fmt(e.optimizer_bytes)} of optimizer state{name} — as much as or more than its "
        f"parameters ({fmt(e.param_bytes)}) and gradients ({fmt(e.grad_bytes)}"
        + ("" if e.grads_recorded else ", counted as the size of the parameters: none recorded yet")
        + ") together. Adam and AdamW keep two fp32 moments per parameter, and an fp32 master copy under mixed "
        "precision."
    )
    shards_it = e.engine in OPTIMIZER_SHARDING_ENGINES
    engine = ENGINE_WORDS.get(e.engine, e.engine)
    severity: Severity = "info"
    if shards_it and e.data_parallel_size > 1:
        detail += f" {engine} already shards it over {e.data_parallel_size} ranks."
    elif shards_it:
        detail += f" {engine} shards it over the data-parallel ranks, and there is only one: it holds all of it."
    elif e.world_size > 1:
        detail += f" It is replicated: each of the {e.world_size} ranks holds the same full copy."
        severity = "warning"
    fix, saving = _optimizer_fix(e, shards_it)
    total = max(e.param_bytes + e.grad_bytes, 1)
    return Explanation(
        title=f"Optimizer state ({fmt(e.optimizer_bytes)} per rank) "
        + (
            f"outweighs parameters and gradients {e.optimizer_bytes / total:.1f}×"
            if e.optimizer_bytes >= 1.1 * total
            else "weighs as much as parameters and gradients together"
        ),
        detail=detail,
        fix=fix,
        severity=severity,
        saving_bytes=saving,
    )


OPTIMIZER_HEAVY = Rule("optimizer-state-dominates", find_optimizer_heavy, explain_optimizer_heavy)


# -- oom ------------------------------------------------------------------------------------------


def find_out_of_memory(m: RunModel) -> OutOfMemory | None:
    first = m.first_oom
    if first is None:
        return None
    return OutOfMemory(
        oom=OomEvidence.of(first, len(m.ooms)),
        found_by=first.found_by,
        engine=m.engine,
        world_size=m.world_size,
        block_type=m.block.type_name if m.block else "",
        others=tuple(
            f"rank {s.rank} during {s.oom.phase}" + (f" in {module_label(s.module)}" if s.module is not None else "")
            for s in m.ooms[1:]
        ),
        peak=KindsEvidence.of(rank.memory_peak, first.oom) if (rank := m.rank(first.rank)) is not None else None,
        at_oom=KindsEvidence.of(first.oom.memory, first.oom),
        kept_graph_bytes=first.oom.kept_graph_bytes,
        kept_by=first.oom.kept_by,
        stack_tensors=tuple(first.oom.stack_tensors),
    )


def explain_out_of_memory(e: OutOfMemory) -> Explanation:
    o = e.oom
    where = f" in `{module_label(o.module)}`" if o.module is not None else ""
    detail = f"Rank {o.rank} ran out of memory on {o.device} during {o.phase}" + (f" (step {o.step})" if o.step else "")
    detail += where + (f" ({o.module_type})" if o.module is not None and o.module_type else "")
    if o.module is not None:
        detail += f": {e.found_by}"
    detail += "."
    if o.engine_step:
        detail += f" The engine was in {o.engine_step}."
    held = ", ".join(h for h in (
        f"asked for {fmt(o.requested_bytes)}" if o.requested_bytes else "",
        f"had {fmt(o.allocated)} already allocated" if o.allocated else "",
        f"{fmt(o.reserved)} reserved" if o.reserved else "",
    ) if h)
    limit = f"a limit of {fmt(o.limit)}" if o.limit else ""
    if held:
        detail += f" It {held}" + (f", under {limit}" if limit else "") + "."
    elif limit:
        detail += f" It ran under {limit}."
    if held_at_oom(e) and e.at_oom is not None:
        detail += f" At the OOM: {e.at_oom.sentence()}."
    if e.kept_by:
        detail += f" Kept outputs of earlier forwards on the failing stack: {e.kept_by}."
    if e.peak is not None:
        detail += f" At the rank's peak{e.peak.when}: {e.peak.sentence()}."
    if e.others:
        detail += " Also out of memory: " + ", ".join(e.others) + "."
    return Explanation(
        title=f"Rank {o.rank} ran out of memory during {o.phase}{where}",
        detail=detail,
        fix=oom_fix(e),
        severity="error",
        modules=(o.module,) if o.module is not None else (),
    )


OUT_OF_MEMORY = Rule("oom", find_out_of_memory, explain_out_of_memory)


# -- nothing-recorded ---------------------------------------------------------------------------


@dataclass(frozen=True)
class NothingRecorded(Evidence):
    status: str
    world_size: int
    last_error: str
    """The last line of a log that reads like an error."""
    log: str
    """The log that says it (its path in the run directory; "" for none)."""
    logs: tuple[str, ...] = ()
    """Every log the run has, by its path in the run directory."""
    rehearsed: str = ""
    """For a rehearsal, the ranks it ran (``ranks 0, 7 of 8``): the others were never meant to write."""


ERROR_MARKERS = ("Error", "Exception", "error:", "Traceback", "Killed", "Aborted", "terminate called")


def find_nothing_recorded(m: RunModel) -> NothingRecorded | None:
    if not m.recorded_nothing or m.status is None or m.status.state == "running":
        return None
    last_error, log = "", ""
    for name, tail in m.log_tails.items():
        errors = [line for line in tail if any(mark in line for mark in ERROR_MARKERS) and "Traceback" not in line]
        if errors:
            last_error, log = errors[-1].strip(), name
            break
    rehearsed = m.rehearsal.ranks_words if m.rehearsal is not None else ""
    return NothingRecorded(m.status_text, m.world_size, last_error[:300], log, tuple(m.log_tails), rehearsed)


def explain_nothing_recorded(e: NothingRecorded) -> Explanation:
    ranks = f"the rehearsed {e.rehearsed}" if e.rehearsed else "its ranks"
    if e.last_error:
        detail = (
            f"The run {e.status}, and none of {ranks} wrote an event: they stopped before shardtop's probe came "
            f"up. `{e.log}` ends with: {e.last_error}"
        )
        fix = f"Fix that error (`{e.log}` in the run directory has the whole traceback), then run again."
    else:
        logs = ", ".join(f"`{log}`" for log in e.logs)
        detail = (
            f"The run {e.status}, and none of {ranks} wrote an event or an error to its log: they were stopped "
            "before shardtop's probe came up (killed, or out of host memory), or the probe was turned off."
        )
        fix = (f"Look at the run's logs ({logs} in the run directory) and run again." if logs
               else "The run left no log either: run it again in a terminal to see what stops it.")
    return Explanation(
        title="Nothing was recorded: the ranks ended before the probe came up",
        detail=detail,
        fix=fix,
        severity="error" if not e.status.startswith("finished") else "warning",
    )


NOTHING_RECORDED = Rule("nothing-recorded", find_nothing_recorded, explain_nothing_recorded)
