"""The post-mortem as document blocks: the same words for the terminal and for an issue.

Every fact comes from the read model (``ReportData.model``) and its findings:
this module only lays them out.
"""

from __future__ import annotations

import time

from shardtop.diagnose import Severity
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
from shardtop.report.memory_blocks import b, gpu_table, memory_section, plan_section, ranks_section
from shardtop.report.tree_summary import summarize_tree
from shardtop.units import count_words
from shardtop.words import module_label

MAX_RANK_COLUMNS = 8
"""Beyond this many ranks the tree shows one ``min … max`` column instead of one per rank."""

SEVERITY_WORDS: dict[Severity, str] = {"error": "✗ error", "warning": "! warning", "info": "i info"}
"""Words beside any colour, so a pasted report reads without it."""

SKIP_WORDS = {"bad": "unreadable", "torn": "cut off", "unknown": "of unknown kinds", "newer": "from a newer shardtop"}


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


MEMORY_VIZ = "python -m torch.cuda._memory_viz trace_plot {file} -o {html}"
"""How a snapshot opens in a browser without a network (or: drag the file into https://pytorch.org/memory_viz)."""


def snapshots_section(data: ReportData) -> list[Block]:
    """The allocator's snapshots the ranks wrote, and how to open them; where a rank ran out of memory on CPU,
    why there is none."""
    rows: list[tuple[str, str]] = []
    for r in data.model.ranks:
        for s in r.state.snapshots:
            moment = "at its OOM" if s.moment == "oom" else "after its explained steps (their peak)"
            cut = ", its allocation trace left out to keep it under the bound" if s.cut else ""
            rows.append((f"rank {r.rank}", f"`{s.file}` ({b(s.bytes)}) {moment}{cut}"))
    story = data.model.first_oom
    if not rows:
        if story is not None and not story.oom.device.startswith("cuda"):
            none = "None: a CPU rank has no caching allocator to snapshot (PyTorch's memory snapshots are CUDA's)."
            return [Heading("Memory snapshots"), Para(none)]
        return []
    first = next(s.file for r in data.model.ranks for s in r.state.snapshots)
    html = first.rsplit("/", 1)[-1].removesuffix(".pickle") + ".html"
    how = MEMORY_VIZ.format(file=data.run.path / first, html=html)
    return [Heading("Memory snapshots"), Facts(tuple(rows)),
            Para(f"Open one in a browser: `{how}`, or drag it into https://pytorch.org/memory_viz.")]


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
    for log, tail in data.model.log_tails.items():
        blocks.append(Details(f"The end of {log}", tail))
    return ([Heading("Tracebacks and logs")] + blocks) if blocks else []


def report_blocks(data: ReportData) -> list[Block]:
    return [
        *header(data),
        *oom_section(data),
        *snapshots_section(data),
        *findings_section(data),
        *ranks_section(data),
        *memory_section(data),
        *plan_section(data),
        *tree_section(data),
        *traceback_section(data),
    ]
