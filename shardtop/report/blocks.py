"""The post-mortem as document blocks: the same words for the terminal and for an issue."""

from __future__ import annotations

import time

from shardtop.config import format_bytes
from shardtop.diagnose import Finding
from shardtop.diagnose.facts import display_path
from shardtop.events import ATTRIBUTED_BY_WORDS, GpuMemory, Oom
from shardtop.report.document import Block, Bullets, Details, Facts, Heading, Para, Table
from shardtop.report.gather import ReportData, allocator_peak, rank_gpu, rank_of_pid
from shardtop.report.tree_summary import summarize_tree

MAX_RANK_COLUMNS = 8
"""Beyond this many ranks the tree shows one ``min … max`` column instead of one per rank."""

SEVERITY_WORDS = {"error": "✗ error", "warning": "! warning", "info": "i info"}
"""Words beside any colour, so a pasted report reads without it."""



def b(n: int | float | None) -> str:
    return "-" if n is None else format_bytes(n)


def count(n: int) -> str:
    """Parameter counts in a few characters: ``262 K``, ``25.2 M``, ``1.3 B``."""
    value = float(n)
    for unit in ("", " K", " M", " B"):
        if abs(value) < 1000:
            return f"{int(value)}" if not unit else f"{value:.3g}{unit}"
        value /= 1000
    return f"{value:.3g} T"


def _when(t: float | None) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t)) if t else "?"


def header(data: ReportData) -> list[Block]:
    f = data.facts
    st = data.state
    rows: list[tuple[str, str]] = [("run", f"`{data.run.id}`")]
    if data.preset:
        rows.append(("preset", f"`{data.preset}`"))
    if data.command:
        rows.append(("command", f"`{data.command}`"))
    if data.program and data.program != data.preset:
        rows.append(("program", f"`{data.program}`"))
    engine = f.engine or "not known yet"
    extra = ", ".join(x for x in (f.strategy, f.driver) if x)
    rows.append(("engine", f"{engine}" + (f" ({extra})" if extra else "")))
    devices = sorted({r.device for r in f.ranks if r.device})
    hosts = st.hosts
    rows.append(
        (
            "world size",
            f"{f.world_size} rank(s)"
            + (f" on {', '.join(hosts)}" if hosts else "")
            + (f"; devices {', '.join(devices)}" if devices else ""),
        )
    )
    status = data.status_text
    exits = sorted({f"{r.exit.status} ({r.exit.code})" for r in st.ranks.values() if r.exit is not None})
    rows.append(("status", status + (f"; ranks left with {', '.join(exits)}" if exits else "")))
    if data.status.exit is not None and data.status.exit.reason not in ("", data.status.state):
        rows.append(("reason", data.status.exit.reason))
    rows.append(("started", _when(data.meta.get("created") or st.first_t)))
    if st.first_t and st.last_t:
        rows.append(("last event", f"{_when(st.last_t)} ({st.last_t - st.first_t:.1f} s after the first)"))
    rows.append(("steps", str(st.step)))
    if f.tree is not None:
        rows.append(("model", f"{count(f.full_params)} parameters, {b(f.full_bytes)}, {len(f.paths)} modules"))
    versions = data.versions
    if versions:
        rows.append(("versions", ", ".join(f"{k} {v}" for k, v in versions.items())))
    rows.append(("events", f"{st.events} read" + (f", {_skipped_words(data)}" if data.skipped_total else "")))
    blocks: list[Block] = [Heading(f"shardtop report: {data.run.id}", 1), Facts(tuple(rows))]
    if data.skipped_total:
        blocks.append(
            Para(
                f"⚠ {data.skipped_total} line(s) of the event files could not be read and were skipped "
                f"({_skipped_words(data)}): what follows may miss what they said."
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


def _skipped_words(data: ReportData) -> str:
    words = {"bad": "unreadable", "torn": "cut off", "unknown": "of unknown kinds", "newer": "from a newer shardtop"}
    return ", ".join(f"{n} {words.get(k, k)}" for k, n in data.skipped.items() if n)


def oom_section(data: ReportData) -> list[Block]:
    oom = data.oom
    if oom is None:
        return []
    rows: list[tuple[str, str]] = [
        ("rank", f"{oom.rank}" + (f" on {oom.host}" if oom.host else "") + f", {oom.device}")
    ]
    rows.append(("phase", oom.phase + (f" (step {oom.step})" if oom.step else "")))
    if oom.engine_step:
        rows.append(("engine step", f"`{oom.engine_step}`"))
    if oom.module is not None:
        rows.append(("module", f"`{display_path(oom.module)}`" + (f" ({oom.module_type})" if oom.module_type else "")))
        rows.append(("found by", ATTRIBUTED_BY_WORDS.get(oom.attributed_by, oom.attributed_by)))
    else:
        rows.append(("module", "not known (" + ATTRIBUTED_BY_WORDS.get(oom.attributed_by, oom.attributed_by) + ")"))
    if oom.module_stack:
        rows.append(("module stack", " → ".join(f"`{display_path(p)}`" for p in oom.module_stack[-6:])))
    rows.append(("requested", b(oom.requested_bytes)))
    held = [
        f"allocated {b(oom.allocated)}" if oom.allocated is not None else "",
        f"reserved {b(oom.reserved)}" if oom.reserved is not None else "",
        f"limit {b(oom.limit)}" if oom.limit else "",
        f"device total {b(oom.total)}" if oom.total else "",
    ]
    if any(held):
        rows.append(("allocator", ", ".join(h for h in held if h)))
    if oom.message:
        rows.append(("error", oom.message.strip().splitlines()[0][:300]))
    others = data.state.ooms[1:]
    if others:
        rows.append(("also", "; ".join(_other(o) for o in others)))
    blocks: list[Block] = [Heading("Out of memory"), Facts(tuple(rows))]
    if oom.gpus:
        blocks.append(Para("GPUs at that moment:"))
        blocks.append(gpu_table(oom.gpus, rank_of_pid(data)))
    return blocks


def _other(o: Oom) -> str:
    return (
        f"rank {o.rank} during {o.phase}"
        + (f" in `{o.module}`" if o.module else "")
        + (f" ({b(o.requested_bytes)} requested)" if o.requested_bytes else "")
    )


def gpu_table(gpus: list[GpuMemory], ranks_by_pid: dict[int, int]) -> Table:
    rows = []
    for g in gpus:
        who = [f"rank {ranks_by_pid[p]}" if p in ranks_by_pid else f"pid {p}" for p in g.pids]
        rows.append((f"GPU {g.index}", g.name, b(g.used), b(g.total), ", ".join(who) or "-"))
    return Table(("GPU", "name", "used", "total", "processes"), tuple(rows), right=frozenset({2, 3}))


def findings_section(findings: tuple[Finding, ...]) -> list[Block]:
    blocks: list[Block] = [Heading("Findings")]
    if not findings:
        blocks.append(Para("No findings: nothing in this run's shards, memory or exit looks wrong."))
        return blocks
    for i, f in enumerate(findings, 1):
        blocks.append(Heading(f"{i}. {SEVERITY_WORDS.get(f.severity, f.severity)}: {f.title}", 3))
        items = [f"**What:** {f.detail}", f"**Fix:** {f.fix}"]
        if f.saving_bytes:
            items.append(f"**Saves:** about {b(f.saving_bytes)} per rank")
        if f.modules:
            shown = ", ".join(f"`{display_path(m)}`" for m in f.modules[:8])
            items.append(f"**Modules:** {shown}" + (f" and {len(f.modules) - 8} more" if len(f.modules) > 8 else ""))
        items.append(f"**Code:** `{f.code}`")
        blocks.append(Bullets(tuple(items)))
    return blocks


def ranks_section(data: ReportData) -> list[Block]:
    ranks = data.facts.ranks
    if not ranks:
        return []
    rows = []
    for r in ranks:
        rs = data.state.ranks[r.rank]
        gpu = rank_gpu(data, r)
        stage = r.holdings.stage if r.holdings is not None else "-"
        rows.append(
            (
                str(r.rank),
                r.host or "-",
                r.device or "-",
                stage,
                b(r.param_bytes) if r.holdings is not None else "-",
                b(r.grad_bytes),
                b(r.optim_bytes),
                b(allocator_peak(r)),
                f"{b(gpu.used)} / {b(gpu.total)}" if gpu is not None else "-",
                b(r.memory.host_rss) if r.memory is not None and r.memory.host_rss else "-",
                (rs.exit.status if rs.exit is not None else (rs.phase or "-")),
            )
        )
    headers = (
        "rank",
        "host",
        "device",
        "snapshot",
        "params",
        "grads",
        "optimizer",
        "allocator peak",
        "GPU (NVML)",
        "host RSS",
        "exit / phase",
    )
    return [
        Heading("Per rank"),
        Table(headers, tuple(rows), right=frozenset({4, 5, 6, 7, 8, 9})),
    ]


def tree_section(data: ReportData) -> list[Block]:
    model = data.model
    if model is None:
        return [Heading("Shard tree"), Para("No module tree reported yet.")]
    oom = data.oom
    summary = summarize_tree(model, oom.module if oom is not None else None)
    ranks = summary.ranks
    per_rank = len(ranks) <= MAX_RANK_COLUMNS
    headers = ["module", "type", "params", "full size"]
    headers += [f"rank {r}" for r in ranks] if per_rank else ["per rank (min … max)"]
    headers += ["state", "device", "note"]
    rows = []
    for row in summary.rows:
        cells = [f"{row.guide}{row.label}", row.type, count(row.params), b(row.full_bytes)]
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


def traceback_section(data: ReportData) -> list[Block]:
    blocks: list[Block] = []
    shown: dict[tuple[str, ...], list[int]] = {}
    for oom in data.state.ooms:
        frames = tuple(oom.traceback)
        if frames in shown:
            shown[frames].append(oom.rank)
            continue
        shown[frames] = [oom.rank]
        lines = [*oom.traceback, *(oom.message.strip().splitlines() if oom.message else [])]
        if lines:
            blocks.append(Details(f"Traceback of the OOM on rank {oom.rank} (innermost last)", tuple(lines)))
    same = [ranks[1:] for ranks in shown.values() if len(ranks) > 1]
    if same:
        blocks.append(Para("The same frames on rank(s) " + ", ".join(str(r) for group in same for r in group) + "."))
    for rank, rs in sorted(data.state.ranks.items()):
        if rs.exit is not None and rs.exit.error and rs.oom is None:
            blocks.append(Details(f"Error on rank {rank} ({rs.exit.status})", tuple(rs.exit.error.splitlines())))
    return ([Heading("Tracebacks")] + blocks) if blocks else []


def report_blocks(data: ReportData) -> list[Block]:
    return [
        *header(data),
        *oom_section(data),
        *findings_section(data.findings),
        *ranks_section(data),
        *tree_section(data),
        *traceback_section(data),
    ]
