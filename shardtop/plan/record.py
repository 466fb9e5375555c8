"""A plan as the run records it: the ``Planned`` event, so the report can set it against the run.

The report and the run view never import torch, and a plan needs it (the
model is built on the meta device), so the rank that knows the strategy
plans it at set-up and writes the figures of the asked strategy into its
event file.  Torch-free.
"""

from __future__ import annotations

from collections.abc import Sequence

from shardtop.plan.compare import Plan
from shardtop.rundir.events import Planned, PlannedRank


def planned_event(plan: Plan, made_by: str, notes: Sequence[str] = ()) -> Planned:
    """The asked strategy's per-rank figures, and the verdict on them."""
    asked = plan.asked
    p = asked.per_rank
    return Planned(
        strategy=asked.strategy.label,
        engine=asked.strategy.engine,
        model=plan.model,
        params=plan.params,
        batch_size=plan.batch_size,
        devices=plan.devices,
        accelerator=plan.accelerator,
        per_rank=PlannedRank(
            params=p.params,
            grads=p.grads,
            optimizer=p.optimizer,
            activations=p.activations,
            gathered=p.gathered,
            buffers=p.buffers,
            conv_workspace=p.conv_workspace,
            peak=p.peak,
            peak_phase=p.peak_phase,
            timeline=list(p.timeline),
        ),
        gpu=plan.gpu.name if plan.gpu is not None else "",
        usable=plan.gpu.usable if plan.gpu is not None else None,
        fits=asked.fits,
        runs_out_at=asked.runs_out_at,
        made_by=made_by,
        notes=[*plan.notes, *notes],
    )
