"""A ``Plan``: the asked strategy and its alternatives, per rank, judged against a GPU.

``make_plan`` is pure and torch-free: given a ``ModelDescription`` (made once
per model, see ``shardtop.trace.presets.describe_preset``) it costs a few milliseconds, so a
launch prompt may call it on every keystroke.
"""

from __future__ import annotations

from dataclasses import dataclass

from shardtop.plan.cards import Gpu
from shardtop.plan.description import ModelDescription
from shardtop.plan.memory import PerRank, convolutions_as_run, per_rank
from shardtop.plan.options import alternatives
from shardtop.plan.strategies import Strategy
from shardtop.plan.verdict import Option, Verdict, judge, option
from shardtop.plan.workspaces import workspace_note
from shardtop.units import format_bytes
from shardtop.words import plural

QUANTIZED_BUILD = ("transformers loads a bitsandbytes 4-bit model whole even under ZeRO-3, never inside "
                   "deepspeed.zero.Init")


@dataclass(frozen=True)
class Plan:
    """Everything ``shardtop plan`` prints, immutable."""

    model: str
    params: int
    param_bytes: int
    batch_size: int
    devices: int
    accelerator: str
    """cuda: planned for GPUs; cpu: for CPU processes (no GPU to fit)."""
    gpu: Gpu | None
    options: tuple[Option, ...]
    """The asked strategy first."""
    verdict: Verdict
    preset: str | None = None
    build_note: str = ""
    command: str | None = None
    """The user's command planned (``shardtop plan -- CMD``), instead of a preset."""
    notes: tuple[str, ...] = ()
    """What the plan could not see, in words, shown after the verdict."""
    planned_for: str = ""
    """Which machine the plan is for, and why, in words (``plan.command.PlanRequest``); "" when not said."""

    @property
    def title(self) -> str:
        """What was planned: the preset, or the user's command."""
        return self.preset or (f"`{self.command}`" if self.command else "a model")

    @property
    def asked(self) -> Option:
        return self.options[0]


def make_plan(
    desc: ModelDescription,
    asked: Strategy,
    *,
    devices: int,
    gpu: Gpu | None,
    accelerator: str = "cuda",
    preset: str | None = None,
    command: str | None = None,
    notes: tuple[str, ...] = (),
) -> Plan:
    """Plan ``asked`` and the alternatives that matter for ``desc`` on ``devices`` ranks."""
    on_gpu = accelerator == "cuda"
    # transformers never builds a 4-bit model inside zero.Init: built whole is the only way it comes
    rebuildable = not desc.packed
    options = tuple(
        option(s, per_rank(desc, s, devices, gpu=on_gpu), gpu)
        for s in alternatives(asked, devices, accelerator, rebuildable=rebuildable)
    )

    def replan(n: int, batch_scale: float) -> PerRank:
        return per_rank(desc, asked, n, gpu=on_gpu, batch_scale=batch_scale)

    return Plan(
        model=desc.name,
        params=desc.param_elements,
        param_bytes=desc.param_bytes,
        batch_size=desc.batch_size,
        devices=devices,
        accelerator=accelerator,
        gpu=gpu,
        options=options,
        verdict=judge(options, gpu, devices, desc.batch_size, replan),
        preset=preset,
        build_note=f"{asked.build_note} ({QUANTIZED_BUILD})" if asked.built_whole and not rebuildable else (
            asked.build_note),
        command=command,
        notes=(*notes, *filter(None, [checkpointing_note(desc, options[0].per_rank),
                                      workspace_note(convolutions_as_run(desc, asked), gpu=on_gpu)])),
    )


def checkpointing_note(desc: ModelDescription, planned: PerRank) -> str | None:
    """What the plan says of activation checkpointing, where the traced forward ran checkpointed regions."""
    if not desc.checkpointed:
        return None
    return (f"activation checkpointing: {plural(desc.checkpointed, 'checkpointed region')} "
            f"(torch.utils.checkpoint) saved as inputs only; the largest recomputed in the backward: "
            f"{format_bytes(planned.recomputed)}, held with its gradients when the backward reaches it.")
