"""What the raw-engine presets share: process group, data, the training loop.

Raw engines stand in where Lightning refuses the device (its FSDPStrategy and
DeepSpeedStrategy refuse CPU) and for users who drive the engines themselves;
the probe is attached exactly as such a user would (``shardtop.probe``).
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Iterable
from typing import Any

import torch

import shardtop.probe as st
from shardtop.runner.context import RankContext


def init_process_group(ctx: RankContext) -> None:
    import torch.distributed as dist

    if ctx.world_size > 1 and not dist.is_initialized():
        backend = "nccl" if ctx.accelerator == "cuda" else "gloo"
        if ctx.accelerator == "cuda":
            torch.cuda.set_device(ctx.local_rank)
        dist.init_process_group(backend=backend, rank=ctx.rank, world_size=ctx.world_size)


def train(
    ctx: RankContext,
    batches: Iterable[Any],
    forward_loss: Callable[[Any], torch.Tensor],
    backward: Callable[[torch.Tensor], None],
    optimizer_step: Callable[[], None],
    after_first_step: Callable[[], object] | None = None,
) -> None:
    """The loop, with its phases and steps told to the probe; cycles over ``batches``.

    ``after_first_step`` re-reads the shards once gradients and optimizer state exist (what it
    returns, such as the probe ``st.attach`` gives back, is not used).
    """
    for index, batch in enumerate(itertools.cycle(batches), start=1):
        started = time.perf_counter()
        st.phase("forward", index)
        loss = forward_loss(batch)
        st.phase("backward")
        backward(loss)
        st.phase("optimizer")
        optimizer_step()
        st.step(index, loss=float(loss.detach().float().item()), seconds=time.perf_counter() - started)
        if index == 1 and after_first_step is not None:
            after_first_step()
        if index >= ctx.config["max_steps"]:
            break


def batches_to(device: str | torch.device, loader: Iterable[Any]) -> list[Any]:
    return [tuple(t.to(device) for t in batch) for batch in loader]
