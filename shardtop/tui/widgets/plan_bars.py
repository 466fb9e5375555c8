"""``PlanBars``: the launch prompt's predicted bar of each GPU, replanned as the user types.

Each GPU (or, on CPU processes, each rank) gets one bar of what the plan says
a rank holds at its peak, against what that GPU allows (its size less what
is not PyTorch's, or ``gpu_mem_limit``): parameters █, gradients ▓,
optimizer state ▒ and the rest of the peak ░ (activations, gathered units,
buffers, the step's temporaries), then "fits" or "does not fit" in words.
GPUs of the same size fold into one row.  The numbers come from
``shardtop.plan`` (pure arithmetic on a model description); this module
only lays them out.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from rich.text import Text
from textual.widgets import Static

from shardtop.plan.cards import Gpu, card, judged_against
from shardtop.plan.compare import Plan
from shardtop.plan.description import ModelDescription
from shardtop.plan.presets import plan_described
from shardtop.plan.verdict import fits, runs_out_at
from shardtop.rundir.engines import MANUAL
from shardtop.rundir.events import when
from shardtop.rundir.memory_figures import GpuMemory
from shardtop.units import short_bytes

BAR_WIDTH = 22
PART_MARKS = ("█", "▓", "▒", "░")
"""Parameters, gradients, optimizer state, the rest of the peak: told apart without colour."""
FREE = "·"
LIMIT = "|"


@dataclass(frozen=True)
class GpuRow:
    """One bar: a GPU (or a run of GPUs of one size), what it allows, and the verdict there."""

    label: str
    gpu: Gpu | None
    fits: bool | None
    runs_out_at: str | None


@dataclass(frozen=True)
class PromptPlan:
    plan: Plan
    """Judged against the smallest GPU: the verdict and the cheapest change."""
    rows: tuple[GpuRow, ...]


def _span(kind: str, first: int, last: int) -> str:
    return f"{kind} {first}" if first == last else f"{kind} {first}-{last}"


def prompt_plan(config: Mapping[str, Any], desc: ModelDescription, gpus: Sequence[GpuMemory]) -> PromptPlan:
    """The plan of a checked launch config, for each GPU it will use (``gpus``: this machine's, as sampled)."""
    accelerator = str(config["accelerator"])
    devices = int(config["devices"])
    limit = config.get("gpu_mem_limit")
    per_device: list[tuple[str, Gpu | None]] = []
    if accelerator == "cuda":
        kind = "GPU"
        for i in range(devices):
            sampled = gpus[i] if i < len(gpus) else (gpus[0] if gpus else None)
            found = (card(sampled.name.removeprefix("NVIDIA ").strip() or "GPU", sampled.total, f"GPU {i}")
                     if sampled else None)
            per_device.append((kind, judged_against(found, limit)))
    else:
        kind = "rank"
        per_device = [(kind, judged_against(None, limit)) for _ in range(int(config["world_size"]))]
    judged = [g for _, g in per_device if g is not None]
    smallest = min(judged, key=lambda g: g.usable, default=None)
    plan = plan_described(config, desc, devices=devices, accelerator=accelerator, gpu=smallest)
    p = plan.asked.per_rank
    if plan.asked.strategy.engine == MANUAL:  # one process: the plan is its busiest device
        label = "busiest GPU" if accelerator == "cuda" else "the process"
        return PromptPlan(plan, (GpuRow(label, smallest, fits(p, smallest), runs_out_at(p, smallest)),))
    rows: list[GpuRow] = []
    start = 0
    for i in range(1, len(per_device) + 1):
        if i == len(per_device) or per_device[i][1] != per_device[start][1]:
            g = per_device[start][1]
            label = _span(kind, start, i - 1) + (" (CPU)" if kind == "rank" else "")
            rows.append(GpuRow(label, g, fits(p, g), runs_out_at(p, g)))
            start = i
    return PromptPlan(plan, tuple(rows))


def _bar(parts: Sequence[int], peak: int, usable: int | None, width: int) -> str:
    """Parts of the peak in cells, then free cells up to what the GPU allows; ``|`` marks the limit when over."""
    scale = max(peak, usable or 0, 1)
    cells: list[str] = []
    total = 0
    for mark, size in zip(PART_MARKS, parts, strict=True):
        total += size
        upto = round(total / scale * width)
        cells.extend(mark * max(0, upto - len(cells)))
    cells.extend(FREE * (width - len(cells)))
    if usable is not None and peak > usable:
        cells[min(width - 1, round(usable / scale * width))] = LIMIT
    return "".join(cells[:width])


def plan_text(pp: PromptPlan) -> Text:
    """The strategy, the legend (the parts and their sizes), one bar per row, where it runs out and what
    to change then.  One line each (``PlanBars`` cuts them with … rather than wrapping them, so that the
    bars stay one under the other at 80 columns)."""
    asked = pp.plan.asked
    p = asked.per_rank
    rest = max(0, p.peak - p.params - p.grads - p.optimizer)
    text = Text()
    text.append(f"Plan: {asked.strategy.label}\n", "bold")
    text.append(f"█ params {short_bytes(p.params)}  ▓ grads {short_bytes(p.grads)}  "
                f"▒ optim {short_bytes(p.optimizer)}\n", "dim")
    text.append(f"░ rest {short_bytes(rest)} (activations {short_bytes(p.activations)}; "
                f"peak at {p.peak_phase})\n", "dim")
    label_width = max(len(r.label) for r in pp.rows)
    for row in pp.rows:
        usable = row.gpu.usable if row.gpu is not None else None
        bar = _bar((p.params, p.grads, p.optimizer, rest), p.peak, usable, BAR_WIDTH)
        text.append(f"{row.label:<{label_width}} {bar} {short_bytes(p.peak)}/{short_bytes(usable)} ")
        if row.fits is None:
            text.append("fits: not judged")
        elif row.fits:
            text.append("✓ fits", "bold")
        else:
            text.append("✗ does not fit", "bold reverse")
        text.append("\n")
    if all(r.fits is None for r in pp.rows):
        text.append("No GPU to judge against: add gpu_mem_limit= to see what fits.", "italic")
    elif asked.runs_out_at is not None:
        text.append(f"Out of memory {when(asked.runs_out_at)}: {asked.dominant} "
                    f"({short_bytes(asked.dominant_bytes)})\n", "italic")
        text.append("Instead: " + _changes(pp.plan), "italic")
    text.rstrip()
    return text


def _changes(plan: Plan) -> str:
    v = plan.verdict
    changes = [f"{v.change.strategy.label}"] if v.change is not None else []
    if v.batch_size is not None:
        changes.append(f"batch_size={v.batch_size}")
    if v.devices is not None:
        changes.append(f"devices={v.devices}")
    return "; or ".join(changes) if changes else "none of the strategies shardtop plans fits this GPU"


class PlanBars(Static):
    """What the plan says of the overrides typed so far; shows waiting, failing or the bars."""

    DEFAULT_CSS = """
    PlanBars {
        height: auto;
        margin-top: 1;
        text-wrap: nowrap;
        text-overflow: ellipsis;
    }
    """

    def show_plan(self, pp: PromptPlan) -> None:
        self.update(plan_text(pp))
        self.display = True

    def show_waiting(self) -> None:
        self.update(Text("Planning: building the model on the meta device in a helper process…", "dim"))
        self.display = True

    def show_failed(self, reason: str) -> None:
        self.update(Text(f"No plan: {reason}", "dim"))
        self.display = True
