"""What ``shardtop fit`` prints: the table of set-ups and the pick, in text or JSON.  Pure.

Every figure is a rehearsal's, named by its run; the plan's batch stands beside it.  A step time is one
rehearsed rank's (collectives not run), and says so.  The JSON is described in ``docs/fit-json.md``.
"""

from __future__ import annotations

import json
from pathlib import Path

from shardtop.fit.measure import Trial, fills_dict, fills_sentence
from shardtop.fit.result import FitResult, SetupResult
from shardtop.rundir.json_files import JsonObject
from shardtop.units import format_bytes
from shardtop.words import aligned, plural

SCHEMA = 1
"""``fit`` in the JSON: its format's version."""
OWN_BATCH = 0
"""The batch of a rehearsal at a command's own micro-batch, where no knob of it changes that."""
STEP_NOTE = "step: one rehearsed rank's, the slower one's median after the first; collectives not run"


def _share(peak: int | None, limit: int) -> str:
    if peak is None:
        return "-"
    return f"{format_bytes(peak)} ({100 * peak / limit:.1f} %)"


def largest_words(s: SetupResult) -> str:
    """``79``, or ``≥ 79`` where the search ended before the next batch ran out of memory."""
    fit = s.largest
    if fit is None:
        return "none" if s.ending == "nothing fits" else "-"
    if fit.batch == OWN_BATCH:
        return "its own"
    return str(fit.batch) if s.too_large is not None and s.too_large.batch == fit.batch + 1 else f"≥ {fit.batch}"


def _row(s: SetupResult, limit: int) -> tuple[str, ...]:
    p = s.prediction
    planned = "-" if p.no_guess else str(p.largest_batch) if p.largest_batch is not None else "none"
    fit, over = s.largest, s.too_large
    step = fit.step_seconds if fit is not None else None
    return (
        s.configuration.label,
        planned,
        largest_words(s),
        str(over.batch) if over is not None else "-",
        _share(fit.peak if fit is not None else None, limit),
        f"{step:.3g} s" if step is not None else "-",
        str(len(s.trials)),
    )


def _fills_line(s: SetupResult) -> str | None:
    trial = s.fills
    if trial is None or trial.largest is None:
        return None
    at = "at its peak" if trial.outcome == "fits" else "at its out-of-memory error"
    moved = trial.largest.offloaded
    host = f"; {format_bytes(moved)} more offloaded to host memory, outside the peak" if moved else ""
    return f"  what fills it: {fills_sentence(trial.largest.fills)} (rank {trial.largest.rank}, micro-batch " \
           f"{trial.batch}, {at}){host}"


def render_text(result: FitResult, directory: Path | None = None) -> str:
    lines = [
        f"shardtop fit: {result.title} on {plural(result.devices, 'GPU')} of {result.gpu} "
        f"(a rank may hold {format_bytes(result.limit)})",
        f"  rehearsed on {result.on}: rank 0 and the last rank of {result.devices}, one after another, two optimizer "
        "steps each; collectives not run",
        "",
        "Knobs",
    ]
    lines += [f"  {row}" for row in aligned(
        [(k.kind, k.where if k.found else f"not exposed: {k.where}") for k in result.knobs])]
    lines += ["", *aligned(
        [("configuration", "planned", "largest", "out of memory at", "peak at largest (of limit)", "step",
          "rehearsals")] + [_row(s, result.limit) for s in result.setups],
        right=(1, 2, 3, 5, 6),
    )]
    for no_guess in dict.fromkeys(s.prediction.no_guess for s in result.setups if s.prediction.no_guess):
        lines.append(f"  planned -: {no_guess}; the search starts at the micro-batch as given and doubles")
    for s in result.setups:
        if s.ending != "found":
            lines.append(f"  {s.configuration.label}: {_ending_words(s)}")
        elif (fills := _fills_line(s)) is not None:
            lines.append(f"  {s.configuration.label}:{fills[1:]}")
    lines += [f"  {STEP_NOTE}", ""]
    if result.planned_only:
        lines.append("Planned only (no knob of the stack sets them; never rehearsed):")
        lines += [f"  {p.strategy}: micro-batch {p.largest_batch}" for p in result.planned_only]
        lines.append("")
    pick = result.pick
    if pick is None or pick.largest is None or result.use is None:
        lines.append(f"Pick: none of the set-ups fits {plural(result.devices, 'GPU')} of {result.gpu}.")
    else:
        lines.append(f"Pick: {pick.configuration.label}, micro-batch {largest_words(pick)}, peak "
                     f"{_share(pick.largest.peak, result.limit)} of {format_bytes(result.limit)}")
        lines += [f"  change: {change}" for change in result.use.changes]
        lines.append(f"  run:    {result.use.line}")
    runs = [t.run_id for s in result.setups for t in s.trials]
    lines += [
        "",
        f"{plural(result.rehearsals, 'rehearsal')} in {_minutes(result.seconds)} of a {_minutes(result.budget_s)} "
        "budget" + (" (spent before every set-up was searched)" if result.budget_spent else "")
        + "; each is a run to open in the TUI or `shardtop report`:",
        *(f"  {run}" for run in runs),
    ]
    if directory is not None:
        lines.append(f"fit's own directory: {directory}")
    return "\n".join(lines) + "\n"


def _ending_words(s: SetupResult) -> str:
    words = {
        "budget": "stopped before its boundary",
        "not reached": "not rehearsed",
        "ruled out": "not rehearsed, the plan rules it out",
        "failed": "a rehearsal failed for another reason than memory",
        "nothing fits": "nothing fits",
    }[s.ending]
    return f"{words} ({s.note})" if s.note else words


def _minutes(seconds: float) -> str:
    whole = int(round(seconds))
    return f"{whole // 60}:{whole % 60:02d}"


def _trial_dict(t: Trial) -> JsonObject:
    return {
        "batch": t.batch,
        "outcome": t.outcome,
        "peak": t.peak,
        "run": t.run_id,
        "run_path": t.run_path,
        "seconds": round(t.seconds, 3),
        "detail": t.detail or None,
        "ranks": [
            {"rank": r.rank, "status": r.state, "peak": r.peak, "steps": r.steps, "step_seconds": r.step_seconds,
             "oom_phase": r.oom_phase, "fills": fills_dict(r.fills), "offloaded_bytes": r.offloaded}
            for r in t.ranks
        ],
    }


def _setup_dict(s: SetupResult, limit: int) -> JsonObject:
    conf, fit, over, p = s.configuration, s.largest, s.too_large, s.prediction
    fills = s.fills
    return {
        "configuration": conf.label,
        "as_given": conf.as_given,
        "zero_stage": conf.zero_stage,
        "offload_optimizer": conf.offload_optimizer,
        "offload_params": conf.offload_params,
        "activation_checkpointing": conf.checkpointing,
        "expandable_segments": conf.expandable_segments,
        "plan": {"strategy": p.strategy, "largest_batch": p.largest_batch, "peak_at_one": p.peak_at_one,
                 "peak_at_largest": p.peak_at_largest, "bytes_per_sample": p.slope,
                 "no_guess": p.no_guess or None},
        "ending": s.ending,
        "note": s.note or None,
        "largest_batch": fit.batch if fit is not None else None,
        "boundary_proven": fit is not None and over is not None and over.batch == fit.batch + 1,
        "first_out_of_memory": over.batch if over is not None else None,
        "peak": fit.peak if fit is not None else None,
        "peak_share": round(fit.peak / limit, 4) if fit is not None and fit.peak is not None else None,
        "fills": None if fills is None or fills.largest is None else {
            "batch": fills.batch, "rank": fills.largest.rank, "at": "peak" if fills.outcome == "fits" else "oom",
            "by_kind": fills_dict(fills.largest.fills), "words": fills_sentence(fills.largest.fills)},
        "step_seconds": fit.step_seconds if fit is not None else None,
        "trials": [_trial_dict(t) for t in s.trials],
    }


def render_json(result: FitResult) -> str:
    pick = result.pick
    data = {
        "fit": SCHEMA,
        "title": result.title,
        "devices": result.devices,
        "gpu": result.gpu,
        "limit": result.limit,
        "rehearsed_on": result.on,
        "knobs": [{"kind": k.kind, "found": k.found, "where": k.where} for k in result.knobs],
        "configurations": [_setup_dict(s, result.limit) for s in result.setups],
        "pick": None if pick is None or pick.largest is None or result.use is None else {
            "configuration": pick.configuration.label, "batch": pick.largest.batch,
            "use": result.use.line, "changes": list(result.use.changes)},
        "planned_only": [{"strategy": p.strategy, "largest_batch": p.largest_batch} for p in result.planned_only],
        "rehearsals": result.rehearsals,
        "seconds": round(result.seconds, 3),
        "budget_seconds": result.budget_s,
        "budget_spent": result.budget_spent,
    }
    return json.dumps(data, indent=2) + "\n"
