"""Rules that turn a run's shard tree, memory and OOM into plain-language findings.

Pure Python over a ``RunState``: the TUI, ``shardtop report`` and tests all
call ``diagnose(state)``.  Each finding has a stable ``code``:

- ``zero3.py``: ``zero3-not-partitioned-at-init``; ``zero3-single-rank`` and
  ``fsdp-single-rank`` (sharding on one rank)
- ``fsdp.py``: ``fsdp-single-unit``, ``fsdp-manual-wrap-ignored``,
  ``fsdp2-no-data-parallel``, ``precision-mismatch``, ``cpu-offload-not-applied``
- ``placement.py``: ``placement-imbalance``
- ``memory.py``: ``optimizer-state-dominates``, and ``oom``, which names the
  culprit when no other finding explains an OOM

A finding of severity ``error`` explains a failure.  The facts every rule
reads are computed once (``facts.py``).  No torch, no textual, no I/O.
"""

from __future__ import annotations

from collections.abc import Callable

from shardtop.diagnose import fsdp, memory, placement, zero3
from shardtop.diagnose.facts import RunFacts
from shardtop.diagnose.finding import SEVERITIES, Finding, severity_key
from shardtop.run_state import RunState

Rule = Callable[[RunFacts], "Finding | None"]

RULES: tuple[Rule, ...] = (
    zero3.zero3_not_partitioned_at_init,
    fsdp.fsdp_manual_wrap_ignored,
    fsdp.fsdp_single_unit,
    fsdp.fsdp2_no_data_parallel,
    zero3.single_rank,
    placement.placement_imbalance,
    fsdp.precision_mismatch,
    memory.optimizer_state_dominates,
    fsdp.cpu_offload_not_applied,
)
"""Every rule but ``oom``, which runs last: it speaks only when these leave an OOM unexplained."""


def diagnose(state: RunState) -> list[Finding]:
    """Every finding the run's events support, most severe first."""
    facts = RunFacts.of(state)
    findings: list[Finding] = []
    for rule in RULES:
        try:
            found = rule(facts)
        except Exception as e:  # noqa: BLE001 - one broken rule must not hide the others
            found = _rule_failed(rule, e)
        if found is not None:
            findings.append(found)
    if facts.ooms and not any(f.severity == "error" for f in findings):
        findings.append(memory.oom_finding(facts))
    return sorted(findings, key=severity_key)


def _rule_failed(rule: Rule, error: Exception) -> Finding:
    name = getattr(rule, "__name__", "rule")
    return Finding(
        code="diagnose-rule-failed",
        title=f"The {name} check could not read this run",
        detail=f"{type(error).__name__}: {error}",
        fix="Report this as a shardtop bug, with `shardtop report RUN --format json` attached.",
        severity="info",
        evidence={"rule": name},
    )


__all__ = ["RULES", "SEVERITIES", "Finding", "diagnose", "severity_key"]
