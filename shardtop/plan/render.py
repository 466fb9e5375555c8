"""A plan as text (the terminal) and Markdown (a bug report).  Torch-free.

Both say the same things in the same order: the model and the GPU, the
strategy as run and its alternatives per rank, then the verdict: fits or
not, where it runs out and what dominates there, the cheapest change that
fits, and what the build does when it matters.
"""

from __future__ import annotations

import textwrap
from typing import Literal

from shardtop.plan.compare import Plan
from shardtop.plan.verdict import Option
from shardtop.rundir.events import when
from shardtop.units import count_words, format_bytes, short_bytes
from shardtop.words import plural

PlanFormat = Literal["text", "markdown", "json"]
"""What ``shardtop plan --format`` writes: text for a terminal, Markdown for an issue, JSON for scripts."""

COLUMNS = ("peak", "params", "grads", "optim", "activ")
TEXT_WIDTH = 100
"""Verdict sentences wrap here; the table's strategy column may run longer."""


def _fits_word(o: Option) -> str:
    return {True: "yes", False: "no", None: "-"}[o.fits]


def _cells(o: Option) -> tuple[int, ...]:
    p = o.per_rank
    return (p.peak, p.params, p.grads, p.optimizer, p.activations)


def _where(plan: Plan) -> str:
    ranks = plural(plan.devices, "rank")
    if plan.accelerator == "cpu" and plan.gpu is None:
        return f"{ranks} on CPU processes (no GPU to fit: add gpu_mem_limit= to judge)"
    if plan.gpu is None:
        return f"{ranks}; no GPU given and none here, so \"fits\" is not judged (add gpu=80GB or gpu=A100-80GB)"
    g = plan.gpu
    return f"{ranks} on {g.name} GPUs (from {g.source}): up to {format_bytes(g.usable)} per rank for PyTorch"


def verdict_lines(plan: Plan) -> list[str]:
    """The verdict in sentences, the same for text and Markdown."""
    asked, v = plan.asked, plan.verdict
    lines: list[str] = []
    if v.fits is None:
        lines.append(f"As run: peak {format_bytes(asked.per_rank.peak)} per rank at {asked.per_rank.peak_phase}; "
                     f"largest part: {asked.dominant} ({format_bytes(asked.dominant_bytes)}).")
    elif v.fits:
        free = plan.gpu.usable - asked.per_rank.peak if plan.gpu else 0
        lines.append(f"As run it fits: peak {format_bytes(asked.per_rank.peak)} per rank "
                     f"at {asked.per_rank.peak_phase} ({format_bytes(free)} to spare); largest part: {asked.dominant} "
                     f"({format_bytes(asked.dominant_bytes)}).")
    else:
        lines.append(f"As run it does not fit: out of memory {when(asked.runs_out_at or '')}, "
                     f"where the largest part is {asked.dominant} ({format_bytes(asked.dominant_bytes)}); "
                     f"peak {format_bytes(asked.per_rank.peak)} per rank.")
    host = asked.per_rank.host
    if host:
        all_ranks = f"; {format_bytes(host * plan.devices)} for all {plan.devices}" if plan.devices > 1 else ""
        lines.append(f"Offloaded to host memory: {format_bytes(host)} per rank{all_ranks} (the parameters, "
                     "gradients and optimizer state the offload moves), not counted in the peak above.")
    if plan.build_note:
        lines.append(f"How it is built: {plan.build_note}.")
    rebuilt = next(
        (o for o in plan.options[1:] if o.strategy == asked.strategy.with_(built_whole=False, build_note="")), None
    )
    if asked.strategy.built_whole and rebuilt is not None and rebuilt.per_rank.setup < asked.per_rank.setup:
        lines.append(f"Built where the engine partitions it as it is made (Lightning: in configure_model(); "
                     f"DeepSpeed: inside deepspeed.zero.Init), set-up needs {format_bytes(rebuilt.per_rank.setup)} "
                     f"instead of {format_bytes(asked.per_rank.setup)}; peak {format_bytes(rebuilt.per_rank.peak)} "
                     f"at {rebuilt.per_rank.peak_phase}.")
    if v.fits is False:
        if v.change is not None:
            lines.append(f"Cheapest change that fits: {v.change.strategy.label} "
                         f"(peak {format_bytes(v.change.per_rank.peak)} per rank).")
        else:
            lines.append("None of the strategies above fits on this GPU." if plan.accelerator == "cuda"
                         else "None of the strategies above fits in this memory limit.")
        if v.batch_size is not None:
            lines.append(f"Or, as run, a batch of {v.batch_size} per rank (batch_size={v.batch_size}) fits.")
        if v.devices is not None:
            lines.append(f"Or, as run, {v.devices} devices (devices={v.devices}) fit.")
    return lines


def render_text(plan: Plan) -> str:
    out = [
        f"Plan for {plan.title.replace('`', '')}: {plan.model}",
        (f"  {count_words(plan.params)} parameters, {format_bytes(plan.param_bytes)} as built; "
         f"batch {plan.batch_size} per rank"),
        f"  {_where(plan)}",
        *textwrap.wrap(f"Planned for {plan.planned_for}.", width=TEXT_WIDTH, initial_indent="  ",
                       subsequent_indent="    ", break_on_hyphens=False) * bool(plan.planned_for),
        "",
        "  " + "".join(f"{c:>8}" for c in COLUMNS) + "  fits  strategy (per rank)",
    ]
    for i, o in enumerate(plan.options):
        mark = "> " if i == 0 else "  "
        cells = "".join(f"{short_bytes(n):>8}" for n in _cells(o))
        suffix = "  (as run)" if i == 0 else ""
        out.append(f"{mark}{cells}  {_fits_word(o):<4}  {o.strategy.label}{suffix}")
    out.append("")
    for line in verdict_lines(plan):
        out.extend(textwrap.wrap(line, width=TEXT_WIDTH, subsequent_indent="  ", break_on_hyphens=False))
    for note in plan.notes:
        out.extend(textwrap.wrap(f"Note: {note}", width=TEXT_WIDTH, subsequent_indent="  ", break_on_hyphens=False))
    return "\n".join(out) + "\n"


def render_markdown(plan: Plan) -> str:
    out = [
        f"### Plan for {plan.title}",
        "",
        (f"- Model: `{plan.model}`: {plan.params:,} parameters, {format_bytes(plan.param_bytes)} as built; "
         f"batch {plan.batch_size} per rank"),
        f"- {_where(plan)}",
        *[f"- Planned for {plan.planned_for}."] * bool(plan.planned_for),
        "",
        "| strategy | params | grads | optimizer | activations | gathered | buffers | peak | host (offloaded) | phase "
        "| fits | note |",
        "|---|--:|--:|--:|--:|--:|--:|--:|--:|---|---|---|",
    ]
    for i, o in enumerate(plan.options):
        p = o.per_rank
        name = f"**{o.strategy.label}** (as run)" if i == 0 else o.strategy.label
        sizes = " | ".join(format_bytes(n) for n in (p.params, p.grads, p.optimizer, p.activations, p.gathered,
                                                      p.buffers, p.peak, p.host))
        out.append(f"| {name} | {sizes} | {p.peak_phase} | {_fits_word(o)} | {o.note} |")
    out.append("")
    out.extend(f"- {line}" for line in verdict_lines(plan))
    out.extend(f"- Note: {note}" for note in plan.notes)
    return "\n".join(out) + "\n"
