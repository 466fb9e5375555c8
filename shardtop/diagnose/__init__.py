"""Rules that turn a run's read model into plain-language findings, each with its evidence.

Pure Python over a ``RunModel``: the TUI, ``shardtop report`` and tests all
call ``diagnose(model)``.  Each rule is a ``Rule``: ``find`` gathers typed
evidence, ``explain`` words a ``Finding`` from that evidence alone.  Stable codes:

- ``zero3.py``: ``zero3-not-partitioned-at-init``; ``zero3-single-rank`` and
  ``fsdp-single-rank`` (sharding on one rank)
- ``fsdp.py``: ``fsdp-single-unit``, ``fsdp-manual-wrap-ignored``, ``fsdp2-no-data-parallel``
- ``fsdp_settings.py``: ``precision-mismatch``, ``cpu-offload-not-applied``
- ``placement.py``: ``placement-imbalance``, ``cuda-context-on-wrong-gpu``
- ``setup_transient.py``: ``sharding-transient-at-setup`` (out of memory while the engine held the
  parameters it was sharding twice, whole and sharded)
- ``memory.py``: ``optimizer-state-dominates``; ``oom``, which names the culprit
  when no other finding explains an OOM; ``nothing-recorded``
- ``reshard.py``: ``fsdp2-not-resharded`` (units kept gathered from forward to backward)
- ``frozen.py``: ``fsdp-frozen-and-trainable-in-one-unit`` (gradients for frozen parameters)
- ``hybrid.py``: ``fsdp-hybrid-shard`` (sharded only within groups)
- ``persistence.py``: ``zero3-persistence-threshold`` (small tensors kept whole by ZeRO-3)
- ``zero12.py``: ``zero12-replicated-params`` (ZeRO-1/2's whole parameters outweigh what they split)
- ``optimizer_order.py``: ``optimizer-before-wrap`` (an optimizer holding the pre-wrap parameters)
- ``host_memory.py``: ``host-memory-whole-model-per-rank`` (N whole copies in host memory)
- ``allocator.py``: ``allocator-fragmentation`` (at an OOM), ``memory-outside-pytorch``
- ``growth.py``: ``memory-grows-every-step`` (tensors kept across steps, and when the rank runs out)
- ``stall.py``: ``rank-stalled`` (a rank waits while the others moved on)
- ``probe_faults.py``: ``probe-fault`` (a part of the probe switched itself off)
- ``plan_missed.py``: ``plan-missed`` (the measured peak is far from the run's own plan)
- ``engine_asked.py``: ``engine-not-as-asked`` (a launcher asked for one engine, the ranks run another)

A finding of severity ``error`` explains a failure.  No torch, no textual, no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from shardtop.diagnose import (
    allocator,
    engine_asked,
    frozen,
    fsdp,
    fsdp_settings,
    growth,
    host_memory,
    hybrid,
    memory,
    optimizer_order,
    persistence,
    placement,
    plan_missed,
    probe_faults,
    reshard,
    setup_transient,
    stall,
    zero3,
    zero12,
)
from shardtop.diagnose.finding import SEVERITIES, Evidence, Explanation, Finding, Rule, Severity, severity_key
from shardtop.read.run_model import RunModel

RULES: tuple[Rule[Any], ...] = (
    zero3.BUILT_WHOLE,
    setup_transient.SETUP_TRANSIENT,
    fsdp.STRAY_LAYERS,
    fsdp.SINGLE_UNIT,
    fsdp.NO_DATA_PARALLEL,
    zero3.ZERO3_SINGLE_RANK,
    zero3.FSDP_SINGLE_RANK,
    placement.IMBALANCE,
    placement.WRONG_GPU,
    fsdp_settings.FP16_UNSCALED,
    memory.OPTIMIZER_HEAVY,
    fsdp_settings.OFFLOAD_MISSING,
    reshard.NOT_RESHARDED,
    frozen.FROZEN_IN_UNIT,
    hybrid.HYBRID_SHARD,
    persistence.PERSISTENT,
    zero12.REPLICATED_PARAMS,
    engine_asked.ENGINE_NOT_ASKED,
    optimizer_order.OPTIMIZER_BEFORE_WRAP,
    host_memory.WHOLE_ON_HOST,
    growth.GROWING,
    stall.STALLED,
    allocator.FRAGMENTED,
    allocator.OUTSIDE_PYTORCH,
    memory.NOTHING_RECORDED,
    probe_faults.PROBE_FAULTS,
    plan_missed.PLAN_MISSED,
)
"""Every rule but ``oom``, which runs last: it speaks only when these leave an OOM unexplained."""


def diagnose(model: RunModel) -> list[Finding]:
    """Every finding the run supports, most severe first."""
    findings: list[Finding] = []
    for rule in RULES:
        found = _apply(rule, model)
        if found is not None:
            findings.append(found)
    if model.ooms and not any(f.severity == "error" for f in findings):
        found = _apply(memory.OUT_OF_MEMORY, model)
        if found is not None:
            findings.append(found)
    return sorted(findings, key=severity_key)


def _apply(rule: Rule[Any], model: RunModel) -> Finding | None:
    try:
        return rule.apply(model)
    except Exception as e:  # noqa: BLE001 - one broken rule must not hide the others
        return rule_failed(rule.code, e)


@dataclass(frozen=True)
class RuleFailed(Evidence):
    rule: str
    error: str


def rule_failed(code: str, error: Exception) -> Finding:
    """A rule that broke on this run says so, as a finding, instead of taking the others down."""
    return Finding(
        code="diagnose-rule-failed",
        title=f"The {code} check could not read this run",
        detail=f"{type(error).__name__}: {error}",
        fix="Report this as a shardtop bug, with `shardtop report RUN --format json` attached.",
        evidence=RuleFailed(code, f"{type(error).__name__}: {error}"),
        severity="info",
    )


__all__ = ["RULES", "SEVERITIES", "Evidence", "Explanation", "Finding", "Rule", "Severity", "diagnose", "severity_key"]
