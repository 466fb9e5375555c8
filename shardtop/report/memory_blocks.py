"""The report's figures rank by rank: what each rank held and how it ended, its peak by kind, the plan
against the run, and the GPUs at an OOM.  Every fact comes from the read model (``ReportData.model``)."""

from __future__ import annotations

from collections.abc import Mapping

from shardtop.read.memory_kinds import KINDS, bytes_by_kind, explained_share, sites_lines
from shardtop.read.other_parts import running_forward
from shardtop.read.plan_check import RankCheck
from shardtop.report.document import Block, Heading, Para, Table
from shardtop.report.gather import ReportData
from shardtop.rundir.events import when
from shardtop.rundir.memory_figures import GpuMemory
from shardtop.units import format_bytes
from shardtop.words import noun


def b(n: int | float | None) -> str:
    return "-" if n is None else format_bytes(n)


OFFLOADED_WORDS = (
    "params, grads and optimizer: what the rank holds on its own device; offloaded: the parameters, gradients "
    "and optimizer state the engine's offload policy holds in host memory instead (DeepSpeed `offload_param` / "
    "`offload_optimizer`, FSDP CPU offload), as the engine says. The allocator's peak and the GPU count only "
    "the device's. On CPU processes host memory is the rank's own, and the offloaded bytes are in its RSS too."
)


def ranks_section(data: ReportData) -> list[Block]:
    m = data.model
    if not m.ranks:
        return []
    offloads = any(r.offloaded.total for r in m.ranks)
    rows = []
    for r in m.ranks:
        gpu = m.gpu_of(r)
        here = r.on_device
        rows.append(
            (
                str(r.rank),
                r.host or "-",
                r.device or "-",
                r.holdings.stage if r.holdings is not None else "-",
                b(here.params) if r.holdings is not None else "-",
                b(here.grads),
                b(here.optimizer),
                *([b(r.offloaded.total) if r.holdings is not None else "-"] if offloads else []),
                b(r.allocator_peak),
                f"{b(gpu.used)} / {b(gpu.total)}" if gpu is not None else "-",
                b(r.memory.host_rss) if r.memory is not None and r.memory.host_rss else "-",
                f"{r.status.mark} {r.status.words}",
            )
        )
    headers = (
        "rank", "host", "device", "snapshot", "params", "grads", "optimizer", *(["offloaded"] if offloads else []),
        "allocator peak", "GPU (NVML)", "host RSS", "status",
    )  # fmt: skip
    table = Table(headers, tuple(rows), right=frozenset(range(4, len(headers) - 1)))
    return [Heading("Per rank"), table, *([Para(OFFLOADED_WORDS)] if offloads else [])]


def _out_of_memory(c: RankCheck) -> str:
    """Whether the rank ran out of memory where the plan said, phase for phase; "" if it did not run out."""
    if c.oom_as_planned:
        return "out of memory, as planned"
    if c.out_of_memory and c.planned_oom_at is not None:
        return f"out of memory {when(c.reached)}, planned {when(c.planned_oom_at)}"
    return "out of memory" if c.out_of_memory else ""


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
        judged = "; ".join(filter(None, (
            f"{error * 100:+.0f} %" + (" ✗ missed" if c.missed else "") if error is not None else "",
            _out_of_memory(c),
        ))) or "-"
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
    if any(r.offloaded.total and not r.device.startswith("cuda") for r in data.model.ranks):
        blocks.append(Para("On CPU processes what the engine offloads stays in the process's own memory: the run's "
                           "parts here count it, as the plan for CPU processes does."))
    blocks.extend(Para(f"Note: {note}") for note in plan.notes)
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
        "other (module buffers, the model's output and what the loss made of it, the backward's gradients in "
        "flight, what a forward still running was making, temporaries): "
        "each kind measured from its own source (tensors found, "
        "engine buffers read, allocator blocks traced); "
        "`unexplained` is what no source accounts for. `cache`: the allocator's reserved minus allocated, "
        "`outside PyTorch`: NVML's count for the process minus reserved, each in the latest sample that has it "
        "(the cache at the OOM for a rank the OOM ended)."
    )
    right = frozenset(range(2, len(headers)))
    running = frozenset(r.rank for r, split in peaks for story in m.ooms
                        if story.oom.rank == r.rank and running_forward(split, story.oom))
    sites = sites_lines(((r.rank, split) for r, split in peaks), running)
    return [Heading("Memory at the peak, by kind"), Table(headers, tuple(rows), right=right), Para(notes),
            *(Para(line) for line in sites)]


def gpu_table(gpus: list[GpuMemory], ranks_by_pid: Mapping[int, int]) -> Table:
    rows = []
    for g in gpus:
        who = [f"rank {ranks_by_pid[p]}" if p in ranks_by_pid else f"pid {p}" for p in g.pids]
        rows.append((f"GPU {g.index}", g.name, b(g.used), b(g.total), ", ".join(who) or "-"))
    return Table(("GPU", "name", "used", "total", "processes"), tuple(rows), right=frozenset({2, 3}))
