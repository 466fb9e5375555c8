"""The report as JSON for scripts and bug trackers: schema in ``docs/report-json.md``.

Pretty-printed, except ``modules``: one module per line, so a 100 000-module
tree stays greppable and about 100 bytes a module per rank.
"""

from __future__ import annotations

import json

import msgspec

from shardtop.diagnose import Finding
from shardtop.read.memory_growth import Growth
from shardtop.read.memory_kinds import split_dict
from shardtop.read.oom_story import OomStory
from shardtop.read.plan_check import MISS_MIN_BYTES, MISS_RATIO, PlanCheck, RankCheck
from shardtop.read.rank_facts import RankFacts
from shardtop.read.run_model import RunModel
from shardtop.read.stalls import Stall
from shardtop.report.gather import ReportData
from shardtop.rundir.events import HELD_KINDS
from shardtop.rundir.json_files import JsonObject
from shardtop.rundir.memory_figures import GpuMemory

REPORT_SCHEMA = "shardtop.report"
REPORT_SCHEMA_VERSION = 2
"""Bumped when a field changes meaning or goes away; new fields do not bump it.
2: ``findings[].evidence`` is each rule's typed evidence (nested objects allowed);
``ranks[].status`` is the rank's status; ``oom.module_type`` is the user's class."""

_MODULES_MARK = "\u0000modules\u0000"


def _gpu(g: GpuMemory) -> JsonObject:
    return {"index": g.index, "name": g.name, "uuid": g.uuid, "used": g.used, "total": g.total, "pids": list(g.pids)}


def _oom(story: OomStory) -> JsonObject:
    o = story.oom
    return {
        "rank": o.rank,
        "host": o.host,
        "device": o.device,
        "phase": o.phase,
        "step": o.step,
        "module": o.module,
        "module_type": story.module_type,
        "attributed_by": o.attributed_by,
        "found_by": story.found_by,
        "engine_step": o.engine_step,
        "module_stack": list(o.module_stack),
        "requested_bytes": o.requested_bytes,
        "allocated": o.allocated,
        "reserved": o.reserved,
        "limit": o.limit,
        "total": o.total,
        "gpus": [_gpu(g) for g in o.gpus] if o.gpus is not None else None,
        "peak": o.peak,
        "memory": split_dict(o.memory),
        "memory_peak": split_dict(o.peak_split),
        "kept_graph_bytes": o.kept_graph_bytes,
        "kept_by": o.kept_by,
        "stack_tensors": [msgspec.to_builtins(t) for t in o.stack_tensors],
        "allocator_stats": msgspec.to_builtins(o.allocator) if o.allocator is not None else None,
        "message": o.message,
        "traceback": list(o.traceback),
        "t": o.t,
    }


def _finding(f: Finding) -> JsonObject:
    return {
        "code": f.code,
        "severity": f.severity,
        "title": f.title,
        "detail": f.detail,
        "fix": f.fix,
        "saving_bytes": f.saving_bytes,
        "modules": list(f.modules),
        "evidence": f.evidence.as_dict(),
    }


def _rank(m: RunModel, r: RankFacts) -> JsonObject:
    mem = r.memory
    gpu = m.gpu_of(r)
    held = r.holdings
    here = r.on_device
    return {
        "rank": r.rank,
        "host": r.host,
        "pid": r.pid,
        "device": r.device,
        "status": r.status.state,
        "status_detail": r.status.detail,
        "snapshot": held.stage if held is not None else None,
        "engine": held.engine if held is not None else None,
        "param_bytes": r.param_bytes if held is not None else None,
        "grad_bytes": r.grad_bytes,
        "optim_bytes": r.optim_bytes,
        "on_device": {"params": here.params, "grads": here.grads, "optimizer": here.optimizer},
        "offloaded": {"params": r.offloaded.params, "grads": r.offloaded.grads, "optimizer": r.offloaded.optimizer},
        "param_bytes_by_device": dict(r.by_device),
        "allocator": None
        if mem is None
        else {"allocated": mem.allocated, "reserved": mem.reserved, "peak": r.allocator_peak, "limit": mem.limit},
        "memory_peak": split_dict(r.memory_peak),
        "memory_now": split_dict(r.memory_now),
        "cache_bytes": r.cache_bytes,
        "outside_pytorch_bytes": r.outside_pytorch_bytes,
        "host_rss": mem.host_rss if mem is not None else None,
        "gpu": _gpu(gpu) if gpu is not None else None,
        "phase": r.state.phase,
        "step": r.state.step,
        "exit": None if r.exit is None else {"code": r.exit.code, "status": r.exit.status, "error": r.exit.error},
        "memory_by_step": [[p.step, p.bytes] for p in r.state.step_memory],
        "growth": _growth(m.growth.get(r.rank)),
        "stall": _stall(m.stalls.get(r.rank)),
        "snapshots": [
            {"moment": s.moment, "file": s.file, "bytes": s.bytes, "cut": s.cut, "entries": s.entries}
            for s in r.state.snapshots
        ],
    }


def _growth(g: Growth | None) -> JsonObject | None:
    if g is None:
        return None
    return {
        "rate": round(g.rate), "first_step": g.first_step, "last_step": g.last_step, "first_bytes": g.first_bytes,
        "last_bytes": g.last_bytes, "seconds_per_step": g.seconds_per_step, "limit": g.limit,
        "out_of_memory_step": g.out_of_memory_step, "seconds_left": g.seconds_left,
    }


def _stall(s: Stall | None) -> JsonObject | None:
    if s is None:
        return None
    return {
        "phase": s.phase, "step": s.step, "idle_s": round(s.idle_s, 3), "usual_step_s": round(s.usual_step_s, 3),
        "peers": [{"rank": p.rank, "step": p.step, "phase": p.phase, "ended": p.ended} for p in s.peers],
        "between_steps": s.between_steps,
    }


def _rehearsal(m: RunModel) -> JsonObject | None:
    r = m.rehearsal
    if r is None:
        return None
    return {"world_size": r.world_size, "ranks": list(r.ranks), "on": r.on or None, "caveat": r.caveat}


def _rank_check(c: RankCheck) -> JsonObject:
    p, m = c.predicted, c.measured
    return {
        "rank": c.rank,
        "reached": c.reached,
        "complete": c.complete,
        "predicted": {
            **{kind: getattr(p, kind) for kind in HELD_KINDS},
            "peak": c.predicted_peak,
            "plan_peak": p.peak,
            "plan_peak_phase": p.peak_phase,
        },
        "measured": {
            "params": m.params,
            "grads": m.grads,
            "optimizer": m.optimizer,
            "peak": m.peak,
            "peak_source": m.peak_source or None,
        },
        "error": c.errors,
        "missed": c.missed,
        "out_of_memory": c.out_of_memory,
        "oom_as_planned": c.oom_as_planned,
    }


def plan_dict(check: PlanCheck | None) -> JsonObject | None:
    """The plan the run wrote at set-up, and predicted against measured per rank (docs/report-json.md)."""
    if check is None:
        return None
    plan = check.plan
    return {
        "strategy": plan.strategy,
        "engine": plan.engine,
        "model": plan.model,
        "params": plan.params,
        "batch_size": plan.batch_size,
        "devices": plan.devices,
        "accelerator": plan.accelerator,
        "gpu": plan.gpu or None,
        "usable_bytes": plan.usable,
        "fits": plan.fits,
        "runs_out_at": plan.runs_out_at,
        "made_by": plan.made_by or None,
        "notes": list(plan.notes),
        "miss_ratio": MISS_RATIO,
        "miss_min_bytes": MISS_MIN_BYTES,
        "per_rank": [_rank_check(c) for c in check.ranks],
    }


def module_rows(data: ReportData) -> list[JsonObject]:
    """Every row of the tree with its own parameters and how each rank holds them.

    ``ranks`` is empty for a module without parameters of its own, which keeps
    containers (and so a 100 000-module tree) cheap.
    """
    model = data.tree
    if model is None:
        return []
    tree = model.tree
    shards = [(rank, model.shards[rank]) for rank in model.ranks]
    rows = []
    for row, path in enumerate(model.paths):
        ranks = []
        activations = any(s.act_bytes is not None and row < len(s.act_bytes) and s.act_bytes[row] for _, s in shards)
        if tree.params[row] or activations:
            for rank, s in shards:
                d, st = s.device[row], s.state[row]
                held: JsonObject = {
                    "rank": rank,
                    "bytes": s.bytes[row],
                    "device": s.devices[d] if 0 <= d < len(s.devices) else None,
                    "state": s.states[st] if 0 <= st < len(s.states) else None,
                }
                per_row = (("grad_bytes", s.grad_bytes), ("optim_bytes", s.optim_bytes), ("act_bytes", s.act_bytes),
                           ("offloaded_grad_bytes", s.offloaded_grad_bytes),
                           ("offloaded_optim_bytes", s.offloaded_optim_bytes))
                for key, values in per_row:
                    if values is not None and row < len(values):
                        held[key] = values[row]  # absent where the snapshot had no such figure: 100 000 rows stay small
                ranks.append(held)
        entry: JsonObject = {
            "path": path,
            "type": tree.type_names[tree.types[row]],
            "params": tree.params[row],
            "bytes": tree.bytes[row],
            "ranks": ranks,
        }
        unit = model.unit_roots.get(row)
        if unit is not None:
            entry["unit"] = unit.kind
        rows.append(entry)
    return rows


def report_dict(data: ReportData) -> JsonObject:
    m = data.model
    st = m.state
    exit_status = m.status.exit if m.status is not None else None
    first = m.first_oom
    return {
        "schema": REPORT_SCHEMA,
        "schema_version": REPORT_SCHEMA_VERSION,
        "run": {
            "id": data.run.id,
            "path": str(data.run.path),
            "preset": m.meta.preset or None,
            "program": m.program or None,
            "command": list(m.meta.command) or None,
            "created": m.meta.created,
            "status": m.status.state if m.status is not None else None,
            "status_text": m.status_text,
            "exit_code": exit_status.code if exit_status is not None else None,
            "signal": exit_status.signal if exit_status is not None else None,
            "first_event": st.first_t,
            "last_event": st.last_t,
        },
        "engine": m.engine or None,
        "strategy": m.strategy or None,
        "driver": m.driver or None,
        "world_size": m.world_size,
        "rehearsal": _rehearsal(m),
        "hosts": list(m.hosts),
        "ranks_by_host": {host: list(ranks) for host, ranks in m.ranks_by_host.items()},
        "slurm": [{"job_id": job, "step_id": step or None} for job, step in m.slurm_steps],
        "step": m.step,
        "versions": dict(m.versions),
        "events": {
            "read": st.events,
            "skipped": data.skipped,
            "skipped_total": st.skipped,
            "inconsistent": st.inconsistent,
        },
        "model": None
        if m.tree is None
        else {"tree_id": m.tree.tree_id, "modules": len(m.paths), "params": m.full_params, "bytes": m.full_bytes},
        "info": dict(m.info),
        "ranks": [_rank(m, r) for r in m.ranks],
        "oom": _oom(first) if first is not None else None,
        "ooms": [_oom(s) for s in m.ooms],
        "findings": [_finding(x) for x in data.findings],
        "plan": plan_dict(m.plan_check),
        "modules": _MODULES_MARK,
    }


def to_json(data: ReportData) -> str:
    text = json.dumps(report_dict(data), indent=2, default=str)
    rows = module_rows(data)
    if rows:
        body = ",\n".join("    " + json.dumps(r, separators=(",", ":")) for r in rows)
        modules = "[\n" + body + "\n  ]"
    else:
        modules = "[]"
    return text.replace(json.dumps(_MODULES_MARK), modules, 1)
