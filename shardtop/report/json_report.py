"""The report as JSON for scripts and bug trackers: schema in ``docs/report-json.md``.

Pretty-printed, except ``modules``: one module per line, so a 100 000-module
tree stays greppable and about 100 bytes a module per rank.
"""

from __future__ import annotations

import json
from typing import Any

from shardtop.diagnose import Finding
from shardtop.events import GpuMemory, Oom
from shardtop.report.gather import ReportData, allocator_peak, rank_gpu

REPORT_SCHEMA = "shardtop.report"
REPORT_SCHEMA_VERSION = 1
"""Bumped when a field changes meaning or goes away; new fields do not bump it."""

_MODULES_MARK = "\u0000modules\u0000"


def _gpu(g: GpuMemory) -> dict[str, Any]:
    return {"index": g.index, "name": g.name, "uuid": g.uuid, "used": g.used, "total": g.total, "pids": list(g.pids)}


def _oom(o: Oom) -> dict[str, Any]:
    return {
        "rank": o.rank,
        "host": o.host,
        "device": o.device,
        "phase": o.phase,
        "step": o.step,
        "module": o.module,
        "module_type": o.module_type,
        "attributed_by": o.attributed_by,
        "engine_step": o.engine_step,
        "module_stack": list(o.module_stack),
        "requested_bytes": o.requested_bytes,
        "allocated": o.allocated,
        "reserved": o.reserved,
        "limit": o.limit,
        "total": o.total,
        "gpus": [_gpu(g) for g in o.gpus] if o.gpus is not None else None,
        "message": o.message,
        "traceback": list(o.traceback),
        "t": o.t,
    }


def _finding(f: Finding) -> dict[str, Any]:
    return {
        "code": f.code,
        "severity": f.severity,
        "title": f.title,
        "detail": f.detail,
        "fix": f.fix,
        "saving_bytes": f.saving_bytes,
        "modules": list(f.modules),
        "evidence": dict(f.evidence),
    }


def _ranks(data: ReportData) -> list[dict[str, Any]]:
    out = []
    for r in data.facts.ranks:
        rs = data.state.ranks[r.rank]
        m = r.memory
        gpu = rank_gpu(data, r)
        held = r.holdings
        out.append(
            {
                "rank": r.rank,
                "host": r.host,
                "pid": r.pid,
                "device": r.device,
                "snapshot": held.stage if held is not None else None,
                "engine": held.engine if held is not None else None,
                "param_bytes": r.param_bytes if held is not None else None,
                "grad_bytes": r.grad_bytes,
                "optim_bytes": r.optim_bytes,
                "param_bytes_by_device": dict(r.by_device),
                "allocator": None
                if m is None
                else {"allocated": m.allocated, "reserved": m.reserved, "peak": allocator_peak(r), "limit": m.limit},
                "host_rss": m.host_rss if m is not None else None,
                "gpu": _gpu(gpu) if gpu is not None else None,
                "phase": rs.phase,
                "step": rs.step,
                "exit": None
                if rs.exit is None
                else {"code": rs.exit.code, "status": rs.exit.status, "error": rs.exit.error},
            }
        )
    return out


def module_rows(data: ReportData) -> list[dict[str, Any]]:
    """Every row of the tree with its own parameters and how each rank holds them.

    ``ranks`` is empty for a module without parameters of its own, which keeps
    containers (and so a 100 000-module tree) cheap.
    """
    model = data.model
    if model is None:
        return []
    tree = model.tree
    shards = [(rank, model.shards[rank]) for rank in model.ranks]
    rows = []
    for row, path in enumerate(model.paths):
        ranks = []
        if tree.params[row]:
            for rank, s in shards:
                d, st = s.device[row], s.state[row]
                ranks.append(
                    {
                        "rank": rank,
                        "bytes": s.bytes[row],
                        "device": s.devices[d] if 0 <= d < len(s.devices) else None,
                        "state": s.states[st] if 0 <= st < len(s.states) else None,
                    }
                )
        entry: dict[str, Any] = {
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


def report_dict(data: ReportData) -> dict[str, Any]:
    f = data.facts
    st = data.state
    exit_status = data.status.exit
    oom = data.oom
    return {
        "schema": REPORT_SCHEMA,
        "schema_version": REPORT_SCHEMA_VERSION,
        "run": {
            "id": data.run.id,
            "path": str(data.run.path),
            "preset": data.preset or None,
            "program": data.program or None,
            "command": data.meta.get("command"),
            "created": data.meta.get("created"),
            "status": data.status.state,
            "status_text": data.status_text,
            "exit_code": exit_status.code if exit_status is not None else None,
            "signal": exit_status.signal if exit_status is not None else None,
            "first_event": st.first_t,
            "last_event": st.last_t,
        },
        "engine": f.engine or None,
        "strategy": f.strategy or None,
        "driver": f.driver or None,
        "world_size": f.world_size,
        "hosts": st.hosts,
        "step": st.step,
        "versions": data.versions,
        "events": {"read": st.events, "skipped": dict(data.skipped), "skipped_total": data.skipped_total},
        "model": None
        if f.tree is None
        else {"tree_id": f.tree.tree_id, "modules": len(f.paths), "params": f.full_params, "bytes": f.full_bytes},
        "info": dict(f.info),
        "ranks": _ranks(data),
        "oom": _oom(oom) if oom is not None else None,
        "ooms": [_oom(o) for o in st.ooms],
        "findings": [_finding(x) for x in data.findings],
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
