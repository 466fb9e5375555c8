"""A plan as JSON for scripts: schema in ``docs/plan-json.md``.  Torch-free.

Bytes are integers; a value that is not known (no GPU given) is ``null``.
"""

from __future__ import annotations

import json

from shardtop.plan.compare import Plan
from shardtop.plan.render import verdict_lines
from shardtop.plan.verdict import Option
from shardtop.rundir.events import HELD_KINDS
from shardtop.rundir.json_files import JsonObject

PLAN_SCHEMA = "shardtop.plan"
PLAN_SCHEMA_VERSION = 1
"""Bumped when a field changes meaning or goes away; new fields do not bump it."""


def _option(o: Option) -> JsonObject:
    s, p = o.strategy, o.per_rank
    return {
        "strategy": s.label,
        "engine": s.engine,
        "sharding": s.sharding or None,
        "precision": s.precision,
        "offload": {"params": s.offload_params, "optimizer": s.offload_optimizer},
        "built_whole": s.built_whole,
        "per_rank": {
            **{kind: getattr(p, kind) for kind in HELD_KINDS},
            "peak": p.peak,
            "phases": dict(zip(("setup", "forward", "backward", "step"), p.phases, strict=True)),
            "host": p.host,
            "recomputed": p.recomputed,
        },
        "peak_phase": p.peak_phase,
        "fits": o.fits,
        "runs_out_at": o.runs_out_at,
        "note": o.note,
    }


def plan_document(plan: Plan) -> JsonObject:
    v = plan.verdict
    return {
        "schema": PLAN_SCHEMA,
        "schema_version": PLAN_SCHEMA_VERSION,
        "preset": plan.preset,
        "command": plan.command,
        "model": {"name": plan.model, "params": plan.params, "bytes": plan.param_bytes, "batch_size": plan.batch_size},
        "devices": plan.devices,
        "accelerator": plan.accelerator,
        "planned_for": plan.planned_for or None,
        "gpu_bytes": plan.gpu.total if plan.gpu else None,
        "gpu": (
            {"name": plan.gpu.name, "source": plan.gpu.source, "usable_bytes": plan.gpu.usable} if plan.gpu else None
        ),
        "asked": plan.asked.strategy.label,
        "options": [_option(o) for o in plan.options],
        "verdict": {
            "fits": v.fits,
            "runs_out_at": plan.asked.runs_out_at,
            "dominant": plan.asked.dominant,
            "dominant_bytes": plan.asked.dominant_bytes,
            "change": v.change.strategy.label if v.change else None,
            "batch_size": v.batch_size,
            "devices": v.devices,
            "text": verdict_lines(plan),
        },
        "notes": list(plan.notes),
    }


def render_json(plan: Plan) -> str:
    return json.dumps(plan_document(plan), indent=2) + "\n"
