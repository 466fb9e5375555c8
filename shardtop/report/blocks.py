"""The post-mortem as document blocks: the same words for the terminal and for an issue.

Every fact comes from the read model (``ReportData.model``) and its findings:
this module only lays them out.
"""

from __future__ import annotations

import time
from collections.abc import Mapping

from shardtop.diagnose import Severity
from shardtop.read.memory_kinds import KINDS, bytes_by_kind, explained_share, sites_lines
from shardtop.read.oom_story import OomStory
from shardtop.report.document import (
    Block,
    Bullets,
    Details,
    Facts,
    Heading,
    Para,
    Table,
)
from shardtop.report.gather import ReportData
from shardtop.report.tree_summary import summarize_tree
from shardtop.rundir.events import when
from shardtop.rundir.memory_figures import GpuMemory
from shardtop.units import count_words, format_bytes
from shardtop.words import module_label, noun

MAX_RANK_COLUMNS = 8
"""Beyond this many ranks the tree shows one ``min … max`` column instead of one per rank."""

SEVERITY_WORDS: dict[Severity, str] = {"error": "✗ error", "warning": "! warning", "info": "i info"}
"""Words beside any colour, so a pasted report reads without it."""

SKIP_WORDS = {"bad": "unreadable", "torn": "cut off", "unknown": "of unknown kinds", "newer": "from a newer shardtop"}


def b(n: int | float | None) -> str:
    return "-" if n is None else format_bytes(n)


def _when(t: float | None) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t)) if t else "?"


def _rank_span(ranks: tuple[int, ...]) -> str:
    """``rank 0``, ``ranks 0-3`` for consecutive ranks, else ``ranks 0, 2, 5``."""
    if len(ranks) == 1:
        return f"rank {ranks[0]}"
    if len(ranks) > 2 and list(ranks) == list(range(ranks[0], ranks[-1] + 1)):
        return f"ranks {ranks[0]}-{ranks[-1]}"
    return "ranks " + ", ".join(map(str, ranks))


def _skipped_words(data: ReportData) -> str:
    return ", ".join(f"{n} {SKIP_WORDS.get(k, k)}" for k, n in data.skipped.items() if n)


def header(data: ReportData) -> list[Block]:
    m = data.model
    st = m.state
    rows: list[tuple[str, str]] = [("run", f"`{data.run.id}`")]
    if m.meta.preset:
        rows.append(("preset", f"`{m.meta.preset}`"))
    if m.meta.command:
        rows.append(("command", f"`{m.meta.command_line}`"))
    if m.program and m.program != m.meta.preset:
        rows.append(("program", f"`{m.program}`"))
    extra = ", ".join(x for x in (m.strategy, m.driver) if x)
    rows.append(("engine", (m.engine or "not known yet") + (f" ({extra})" if extra else "")))
    devices = sorted({r.device for r in m.ranks if r.device})
    where = f" on {len(m.hosts)} hosts" if len(m.hosts) > 1 else f" on {m.hosts[0]}" if m.hosts else ""
    if m.rehearsal is not None:
        rows.append(("rehearsal", m.rehearsal.headline))
        if m.hosts:
            rows.append(("host", ", ".join(m.hosts)))
    else:
        rows.append(
            ("world size", f"{m.world_size} rank(s){where}" + (f"; devices {', '.join(devices)}" if devices else ""))
        )
    if len(m.ranks_by_host) > 1:
        rows.append(("hosts", "; ".join(f"{host}: {_rank_span(ranks)}" for host, ranks in m.ranks_by_host.items())))
    if m.slurm_steps:
        rows.append(
            ("slurm", ", ".join(f"job {job}" + (f" step {step}" if step else "") for job, step in m.slurm_steps))
        )
    rows.append(("status", m.status_text))
    if m.status is not None and m.status.exit is not None and m.status.exit.reason not in ("", m.status.state):
        rows.append(("reason", m.status.exit.reason))
    rows.append(("started", _when(m.meta.created or st.first_t)))
    if st.first_t and st.last_t:
        rows.append(("last event", f"{_when(st.last_t)} ({st.last_t - st.first_t:.1f} s after the first)"))
    rows.append(("steps", str(m.step)))
    if m.tree is not None:
        rows.append(("model", f"{count_words(m.full_params)} parameters, {b(m.full_bytes)}, {len(m.paths)} modules"))
    if m.versions:
        rows.append(("versions", ", ".join(f"{k} {v}" for k, v in m.versions.items())))
    events = f"{st.events} read"
    if st.skipped:
        events += f", {_skipped_words(data)}"
    if st.inconsistent:
        events += f", {st.inconsistent} inconsistent left out"
    rows.append(("events", events))
    blocks: list[Block] = [Heading(f"shardtop report: {data.run.id}", 1), Facts(tuple(rows))]
    if m.rehearsal is not None:
        blocks.append(Para(f"⚠ {m.rehearsal.caveat}"))
    if st.skipped or st.inconsistent:
        what = [_skipped_words(data)] if st.skipped else []
        what += [f"{st.inconsistent} that contradicted the tree or themselves"] if st.inconsistent else []
        blocks.append(
            Para(
                f"⚠ {st.skipped + st.inconsistent} event line(s) could not be used ({'; '.join(what)}): "
                "what follows may miss what they said."
            )
        )
    if not st.events:
        blocks.append(
            Para(
                "No events yet: the ranks have not reported anything (still starting, or they failed "
                "before the probe came up — see the rank logs in the run directory)."
            )
        )
    return blocks


def oom_section(data: ReportData) -> list[Block]:
    story = data.model.first_oom
    if story is None:
        return []
    oom = story.oom
    rows: list[tuple[str, str]] = [
        ("rank", f"{oom.rank}" + (f" on {oom.host}" if oom.host else "") + f", {oom.device}")
    ]
    rows.append(("phase", story.when.removeprefix("during ")))
    if oom.engine_step:
        rows.append(("engine step", f"`{oom.engine_step}`"))
    if oom.module is not None:
        module = f"`{module_label(oom.module)}`" + (f" ({story.module_type})" if story.module_type else "")
    else:
        module = story.culprit
    rows.append(("module", module))
    rows.append(("found by", story.found_by))
    if story.stack:
        rows.append((
            "module stack",
            ("… → " if story.stack_cut else "") + " → ".join(f"`{module_label(p)}`" for p in story.stack),
        ))
    rows.append(("requested", b(oom.requested_bytes)))
    if story.held:
        rows.append(("allocator", ", ".join(f"{label} {b(v)}" for label, v in story.held)))
    rank = data.model.rank(oom.rank)
    rows += story.memory_rows(rank.memory_peak if rank is not None else None)
    if story.error_line:
        rows.append(("error", story.error_line[:300]))
    others = data.model.ooms[1:]
    if others:
        rows.append(("also", "; ".join(s.short.removeprefix("OOM on ") for s in others)))
    blocks: list[Block] = [Heading("Out of memory"), Facts(tuple(rows))]
    if oom.gpus:
        blocks.append(Para("GPUs at that moment:"))
        blocks.append(gpu_table(oom.gpus, data.rank_of_pid))
    return blocks


def memory_section(data: ReportData) -> list[Block]:
    """Each rank's peak by kind, beside the allocator's cache and memory outside PyTorch."""
    m = data.model
    peaks = [(r, r.memory_peak) for r in m.ranks]
    if not any(split is not None for _, split in peaks):
        return []
    rows = []
    for r, split in peaks:
        if split is None:
            rows.append(
                (str(r.rank), "-", "-", *("-" for _ in KINDS), "-", "-", b(r.cache_bytes), b(r.outside_pytorch_bytes))
            )
            continue
        share = explained_share(split)
        rows.append(
            (
                str(r.rank),
                f"step {split.step}, {split.phase}" if split.phase else "-",
                b(split.allocated),
                *(b(v) for v in bytes_by_kind(split).values()),
                b(split.unexplained),
                f"{100 * share:.1f} %" if share is not None else "-",
                b(r.cache_bytes),
                b(r.outside_pytorch_bytes),
            )
        )
    headers = ("rank", "peak at", "allocated", *KINDS, "unexplained", "explained", "cache", "outside PyTorch")
    notes = (
        "params, grads, optimizer (state), activations (saved for backward), kept (from earlier steps), "
        "script (made by the training script's own code, outside the model), comm (communication buffers), "
        "workspace (cuBLAS's and cuBLASLt's), "
        "other (module buffers and temporaries): each kind measured from its own source (tensors found, "
        "engine buffers read, allocator blocks traced); "
        "`unexplained` is what no source accounts for. `cache`: the allocator's reserved minus allocated, "
        "`outside PyTorch`: NVML's count for the process minus reserved, each in the latest sample that has it "
        "(the cache at the OOM for a rank the OOM ended)."
    )
    right = frozenset(range(2, len(headers)))
    sites = sites_lines((r.rank, split) for r, split in peaks)
    return [Heading("Memory at the peak, by kind"), Table(headers, tuple(rows), right=right), Para(notes),
            *(Para(line) for line in sites)]


def gpu_table(gpus: list[GpuMemory], ranks_by_pid: Mapping[int, int]) -> Table:
    rows = []
    for g in gpus:
        who = [f"rank {ranks_by_pid[p]}" if p in ranks_by_pid else f"pid {p}" for p in g.pids]
        rows.append((f"GPU {g.index}", g.name, b(g.used), b(g.total), ", ".join(who) or "-"))
    return Table(("GPU", "name", "used", "total", "processes"), tuple(rows), right=frozenset({2, 3}))


def findings_section(data: ReportData) -> list[Block]:
    findings = data.findings
    blocks: list[Block] = [Heading("Findings")]
    if not findings:
        blocks.append(Para(_no_findings_words(data)))
        return blocks
    for i, f in enumerate(findings, 1):
        blocks.append(Heading(f"{i}. {SEVERITY_WORDS.get(f.severity, f.severity)}: {f.title}", 3))
        items = [f"**What:** {f.detail}"] + ([f"**Fix:** {f.fix}"] if f.fix else [])
        if f.saving_bytes:
            items.append(f"**Saves:** about {b(f.saving_bytes)} per rank")
        if f.modules:
            shown = ", ".join(f"`{module_label(m)}`" for m in f.modules[:8])
            items.append(f"**Modules:** {shown}" + (f" and {len(f.modules) - 8} more" if len(f.modules) > 8 else ""))
        items.append(f"**Code:** `{f.code}`")
        blocks.append(Bullets(tuple(items)))
    return blocks


def _no_findings_words(data: ReportData) -> str:
    """What "no findings" means depends on what was seen: say what was checked."""
    m = data.model
    if m.recorded_nothing:
        return "No findings: nothing was recorded yet."
    seen = []
    if m.tree is not None:
        seen.append("the shard tree")
    if any(r.memory is not None for r in m.ranks):
        seen.append("memory samples")
    if any(r.exit is not None for r in m.ranks):
        seen.append("the ranks' exits")
    if not seen:
        return "No findings yet: the ranks have not reported their shards or memory."
    return f"No findings: nothing in {', '.join(seen)} looks wrong."


def ranks_section(data: ReportData) -> list[Block]:
    m = data.model
    if not m.ranks:
        return []
    rows = []
    for r in m.ranks:
        gpu = m.gpu_of(r)
        rows.append(
            (
                str(r.rank),
                r.host or "-",
                r.device or "-",
                r.holdings.stage if r.holdings is not None else "-",
                b(r.param_bytes) if r.holdings is not None else "-",
                b(r.grad_bytes),
                b(r.optim_bytes),
                b(r.allocator_peak),
                f"{b(gpu.used)} / {b(gpu.total)}" if gpu is not None else "-",
                b(r.memory.host_rss) if r.memory is not None and r.memory.host_rss else "-",
                f"{r.status.mark} {r.status.words}",
            )
        )
    headers = (
        "rank", "host", "device", "snapshot", "params", "grads", "optimizer",
        "allocator peak", "GPU (NVML)", "host RSS", "status",
    )  # fmt: skip
    return [Heading("Per rank"), Table(headers, tuple(rows), right=frozenset({4, 5, 6, 7, 8, 9}))]


def plan_section(data: ReportData) -> list[Block]:
    """The plan the run wrote at set-up against what each rank measured (``RunModel.plan_check``)."""
    check = data.model.plan_check
    if check is None:
        return []
    plan = check.plan
    if plan.fits is None:
        verdict = "fits was not judged (no GPU or limit to judge against)"
    elif plan.fits:
        verdict = f"it fits {plan.gpu} ({b(plan.usable)} usable per rank)"
    else:
        verdict = (
            f"it does not fit {plan.gpu} ({b(plan.usable)} usable per rank): "
            f"out of memory {when(plan.runs_out_at or '')}"
        )
    who = {"preset": "rank 0 of the preset run", "shardtop run": "the injected rank 0"}.get(plan.made_by, "the run")
    ranks = noun(plan.devices, "rank")
    rows = []
    for c in check.ranks:
        p, m = c.predicted, c.measured
        error = c.peak_error
        if error is not None:
            judged = f"{error * 100:+.0f} %" + (" ✗ missed" if c.missed else "")
        elif c.out_of_memory:
            judged = "out of memory, as planned" if plan.fits is False else "out of memory"
        else:
            judged = "-"
        rows.append(
            (
                str(c.rank),
                c.reached,
                f"{b(p.params)} / {b(m.params)}",
                f"{b(p.grads)} / {b(m.grads)}",
                f"{b(p.optimizer)} / {b(m.optimizer)}",
                f"{b(c.predicted_peak)} / {b(m.peak)}",
                judged,
            )
        )
    headers = ("rank", "reached", "params (plan / run)", "grads", "optimizer", "peak", "peak error")
    blocks: list[Block] = [
        Heading("Plan against the run"),
        Para(
            f"Planned by {who} at set-up: **{plan.strategy}** for `{plan.model}` on {plan.devices} {ranks}, "
            f"batch {plan.batch_size} per rank; {verdict}. Each peak is the plan's up to the phase the rank "
            "reached; the error is (plan − run) / run."
        ),
        Table(headers, tuple(rows), right=frozenset({2, 3, 4, 5, 6})),
    ]
    if all(c.measured.peak is None for c in check.ranks):
        blocks.append(
            Para("No peak was measured: CPU processes have no allocator to ask, only their parts are compared.")
        )
    blocks.extend(Para(f"Note: {note}") for note in plan.notes)
    return blocks


def tree_section(data: ReportData) -> list[Block]:
    model = data.tree
    if model is None:
        return [Heading("Shard tree"), Para("No module tree reported yet.")]
    first = data.model.first_oom
    summary = summarize_tree(model, first.module if first is not None else None)
    ranks = summary.ranks
    per_rank = len(ranks) <= MAX_RANK_COLUMNS
    headers = ["module", "type", "params", "full size"]
    headers += [f"rank {r}" for r in ranks] if per_rank else ["per rank (min … max)"]
    headers += ["state", "device", "note"]
    rows = []
    for row in summary.rows:
        cells = [f"{row.guide}{row.label}", row.type, count_words(row.params), b(row.full_bytes)]
        if per_rank:
            cells += [b(x) for x in row.rank_bytes]
        else:
            cells.append(f"{b(min(row.rank_bytes))} … {b(max(row.rank_bytes))}" if row.rank_bytes else "-")
        cells += [row.state, row.device, row.note]
        rows.append(tuple(cells))
    numbers = frozenset(range(2, 4 + (len(ranks) if per_rank else 1)))
    stage = f" as held at the {summary.stage} snapshot" if summary.stage else ""
    blocks: list[Block] = [
        Heading("Shard tree"),
        Para(
            f"Parameter bytes of each subtree{stage}: full size, and what each rank stores. "
            "Repeated siblings are folded into one row."
        ),
        Table(tuple(headers), tuple(rows), right=numbers, code=frozenset({0})),
    ]
    if summary.hidden:
        blocks.append(
            Para(
                f"… {summary.hidden} more row(s) of {summary.modules} modules: "
                f"`shardtop attach {data.run.id}` shows the whole tree."
            )
        )
    if not ranks:
        blocks.append(Para("No rank has reported how it holds this tree yet."))
    return blocks


def _traceback_lines(story: OomStory) -> tuple[str, ...]:
    o = story.oom
    return (*o.traceback, *(o.message.strip().splitlines() if o.message else []))


def traceback_section(data: ReportData) -> list[Block]:
    blocks: list[Block] = []
    shown: dict[tuple[str, ...], list[int]] = {}
    for story in data.model.ooms:
        frames = tuple(story.oom.traceback)
        if frames in shown:
            shown[frames].append(story.rank)
            continue
        shown[frames] = [story.rank]
        lines = _traceback_lines(story)
        if lines:
            blocks.append(Details(f"Traceback of the OOM on rank {story.rank} (innermost last)", lines))
    same = [ranks[1:] for ranks in shown.values() if len(ranks) > 1]
    if same:
        blocks.append(Para("The same frames on rank(s) " + ", ".join(str(r) for group in same for r in group) + "."))
    for r in data.model.ranks:
        if r.exit is not None and r.exit.error and r.oom is None:
            blocks.append(Details(f"Error on rank {r.rank} ({r.status.state})", tuple(r.exit.error.splitlines())))
    for rank, tail in sorted(data.model.log_tails.items()):
        who = "the launcher" if rank < 0 else f"rank {rank}"
        blocks.append(Details(f"The end of {who}'s log", tail))
    return ([Heading("Tracebacks and logs")] + blocks) if blocks else []


def report_blocks(data: ReportData) -> list[Block]:
    return [
        *header(data),
        *oom_section(data),
        *findings_section(data),
        *ranks_section(data),
        *memory_section(data),
        *plan_section(data),
        *tree_section(data),
        *traceback_section(data),
    ]
