"""FSDP settings that do not do what they were set for: fp16 without loss scaling
(``precision-mismatch``), CPU offload that is not in effect (``cpu-offload-not-applied``)."""

from __future__ import annotations

from dataclasses import dataclass

from shardtop.diagnose.finding import Evidence, Explanation, Rule
from shardtop.diagnose.fsdp import fsdp_rank
from shardtop.read.run_model import RunModel
from shardtop.rundir.engines import FSDP_ENGINES

FP16_NAMES = frozenset({"float16", "torch.float16", "half", "fp16"})
"""How the probe may spell float16 in ``param_dtype``."""

FULL_PRECISIONS = ("32", "64")
"""Lightning precision settings (``32``, ``32-true``, ``64-true``) under which no grad scaler runs."""


# -- precision-mismatch -------------------------------------------------------------------------


@dataclass(frozen=True)
class Fp16Unscaled(Evidence):
    param_dtype: str
    reduce_dtype: str
    precision: str
    lightning: bool


def find_fp16_unscaled(m: RunModel) -> Fp16Unscaled | None:
    if m.engine not in FSDP_ENGINES:
        return None
    info = m.info
    param_dtype = str(info.get("param_dtype") or "")
    if param_dtype not in FP16_NAMES:
        return None
    precision = str(info.get("precision") or "")
    scaling = info.get("loss_scaling")
    if scaling is True or not (precision.startswith(FULL_PRECISIONS) or scaling is False):
        return None
    return Fp16Unscaled(param_dtype, str(info.get("reduce_dtype") or ""), precision, m.lightning or bool(precision))


def explain_fp16_unscaled(e: Fp16Unscaled) -> Explanation:
    detail = (
        f"FSDP computes in float16 (MixedPrecision param_dtype={e.param_dtype}"
        + (f", reduce_dtype={e.reduce_dtype}" if e.reduce_dtype else "")
        + ")"
        + (f", but the run uses precision={e.precision!r}" if e.precision else "")
        + " and scales no loss. float16 gradients without a GradScaler underflow to zero when small and overflow "
        "when large, so training can stall or diverge without an error."
    )
    if e.lightning:
        detail += " Lightning adds FSDP's sharded grad scaler only under precision='16-mixed'."
        fix = (
            '`Trainer(precision="16-mixed")` (Lightning then adds the sharded grad scaler and sets the '
            'fp16 MixedPrecision itself), or bfloat16: `Trainer(precision="bf16-mixed")`, which needs no scaler.'
        )
    else:
        fix = (
            "Scale the loss with `torch.distributed.fsdp.sharded_grad_scaler.ShardedGradScaler` "
            "(`scaler.scale(loss).backward(); scaler.step(opt); scaler.update()`), or use "
            "`MixedPrecision(param_dtype=torch.bfloat16)`, which needs no scaler."
        )
    return Explanation(
        title="float16 mixed precision without loss scaling",
        detail=detail,
        fix=fix,
        severity="warning",
    )


FP16_UNSCALED = Rule("precision-mismatch", find_fp16_unscaled, explain_fp16_unscaled)


# -- cpu-offload-not-applied --------------------------------------------------------------------


@dataclass(frozen=True)
class OffloadMissing(Evidence):
    devices: tuple[str, ...]
    root_wrapped: bool


def find_offload_missing(m: RunModel) -> OffloadMissing | None:
    if m.engine not in FSDP_ENGINES or not m.info.get("cpu_offload_requested"):
        return None
    r = fsdp_rank(m)
    if r is None or r.shards is None:
        return None
    s = r.shards
    if s.info.get("offload") or any(u.offload for u in s.units):
        return None
    return OffloadMissing(tuple(sorted(r.by_device)), s.info.get("root_wrapped") is not False)


def explain_offload_missing(e: OffloadMissing) -> Explanation:
    detail = (
        "cpu_offload was requested, but no FSDP unit offloads its parameters: "
        f"they stay on {', '.join(e.devices) or '?'}."
    )
    if e.devices == ("cpu",):
        detail += (
            " These ranks run on CPU, where there is nothing to offload to (FSDP pins offloaded shards in "
            "page-locked memory, which needs a GPU); on GPUs the same setting keeps the shards in host memory."
        )
    if not e.root_wrapped:
        detail += " Offloading only ever applies to FSDP units: layers outside every unit are never offloaded."
    return Explanation(
        title="CPU offload was requested but is not in effect",
        detail=detail,
        fix="On GPUs, pass `cpu_offload=CPUOffload(offload_params=True)` to every unit (Lightning: "
        "`FSDPStrategy(cpu_offload=True)` with the layers wrapped by the strategy, not by hand).",
        severity="info",
    )


OFFLOAD_MISSING = Rule("cpu-offload-not-applied", find_offload_missing, explain_offload_missing)
