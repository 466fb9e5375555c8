"""FSDP2's backward planned unit by unit, against real training steps on gloo CPU ranks.

A CPU ``shardtop run`` samples its heap once a step, not at the backward's peak, so the steps run here on
real ranks (``tests/support/fsdp2_steps.py``) with every live storage counted, whole parameters that FSDP2
frees and makes again in place included (``live_bytes.LiveStorageBytes``), as ``test_plan_checkpointing.py``
sets a plan against one process.

Two shapes of model, on one rank (each unit copied from its shard for its backward) and on two (all-gathered,
the next unit's all-gather issued beside): activations as large as a unit, where the start of backward, with
every activation and no gradient yet, weighs as much as a unit's backward; and units whose gradients outweigh
the activations, where the most is held in a unit's backward, beside the sharded gradients of the units
already reduced and the previous unit's reduce-scatter input.  Counting a unit's whole gradients and its
reduce-scatter input at the start of backward as well puts the plan 9 to 22 % above these steps.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from shardtop.plan.memory import PerRank, per_rank
from shardtop.plan.strategies import ADAMW, Strategy
from shardtop.trace.describe import describe_model
from shardtop.trace.meta import build_on_meta
from tests.support.distributed import run_ranks
from tests.support.fsdp2_steps import Net, loss_of

SHAPES = {
    "activations as large as a unit": (1024, 2, 512),
    "unit gradients larger than the activations": (1024, 4, 8),
}
"""(width, blocks, batch): a block holds width x width weights; it saves two batch x width activations."""
TOLERANCE = 0.05
"""Measured on this machine (torch 2.13): from 4.2 % to 0.03 % low.  On two ranks a backward holds 2 MB more in
some runs than in others (``bench/RESULTS.md``): 6 % of the first one of the second shape, before the optimizer
has its state, so only the second step's is held to it."""


def planned(width: int, blocks: int, batch: int, ranks: int) -> PerRank:
    """The plan of ``Net`` traced on the meta device, each block a unit, on ``ranks`` CPU ranks."""
    x, y = torch.empty(batch, width, device="meta"), torch.empty(batch, 1, device="meta")
    desc = describe_model(build_on_meta(lambda: Net(width, blocks)), lambda m: loss_of(m, x, y), name="net",
                          batch_size=batch, input_bytes=4 * (x.numel() + y.numel()))
    units = tuple(r for r, t in enumerate(desc.types) if t == "Block")
    strategy = Strategy(engine="fsdp2", sharding="FULL_SHARD", units=units, root_wrapped=True, optimizer=ADAMW)
    return per_rank(desc, strategy, ranks, gpu=False)


@pytest.mark.parametrize("ranks", [1, 2])
@pytest.mark.parametrize("shape", SHAPES)
def test_fsdp2s_backward_is_planned_within_five_percent_of_a_real_step(shape: str, ranks: int, tmp_path: Path) -> None:
    width, blocks, batch = SHAPES[shape]
    measured = run_ranks("tests.support.fsdp2_steps:two_steps", ranks, tmp_path, width=width, blocks=blocks,
                         batch=batch)
    plan = planned(width, blocks, batch, ranks)
    assert plan.peak_phase == "backward"
    for rank, peaks in enumerate(measured):
        backward = peaks["backward 2"]
        assert backward == max(peaks.values()), (rank, peaks)
        planned_backward = plan.timeline.next_backward
        assert abs(planned_backward - backward) <= TOLERANCE * backward, (
            f"rank {rank}: planned {planned_backward}, measured {backward} ({planned_backward / backward - 1:+.1%})")
