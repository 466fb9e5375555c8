"""Rank function for test_plan_fsdp2.py: two real FSDP2 training steps on gloo CPU ranks, every live storage
counted (``live_bytes.LiveStorageBytes``), and the model they train, for its plan."""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn


class Block(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.fc = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.fc(self.norm(x))


class Net(nn.Module):
    """Residual blocks, each an FSDP2 unit, and a head the root keeps."""

    def __init__(self, dim: int, depth: int) -> None:
        super().__init__()
        self.blocks = nn.Sequential(*(Block(dim) for _ in range(depth)))
        self.head = nn.Linear(dim, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.blocks(x))


def loss_of(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return nn.functional.mse_loss(model(x), y)


def two_steps(rank: int, world_size: int, out_dir: Path, width: int, blocks: int, batch: int) -> dict[str, int]:
    """The most bytes live in each phase of two AdamW steps (``forward 1`` ... ``step 2``): ``fully_shard`` on
    each block and on the root, as a user's script calls it."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    from tests.support.live_bytes import LiveStorageBytes

    dist.init_process_group("gloo")
    mesh = init_device_mesh("cpu", (world_size,))
    live = LiveStorageBytes()
    with live:
        torch.manual_seed(0)
        model = Net(width, blocks)
        for block in model.blocks:
            fully_shard(block, mesh=mesh)
        fully_shard(model, mesh=mesh)
        optimizer = torch.optim.AdamW(model.parameters())
        x, y = torch.randn(batch, width), torch.randn(batch, 1)
        for step in (1, 2):
            live.phase = f"forward {step}"
            loss = loss_of(model, x, y)
            live.phase = f"backward {step}"
            loss.backward()
            live.phase = f"step {step}"
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
    dist.destroy_process_group()
    return live.peaks
