"""FSDP1 without an auto-wrap policy: the whole model becomes one unit, the root.

A training script as people write it from the FSDP tutorial, minus the
``auto_wrap_policy``: ``FSDP(model)``.  Every forward then all-gathers every
parameter at once.  Start one process per rank (torchrun, or any launcher that
sets RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT); CPU processes use gloo.

    torchrun --nproc-per-node 2 tests/diagnose_scripts/fsdp1_no_wrap_policy.py
"""

from __future__ import annotations

import argparse

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

import shardtop.probe as st


class Block(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.up = nn.Linear(dim, 4 * dim)
        self.act = nn.GELU()
        self.down = nn.Linear(4 * dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(self.act(self.up(self.norm(x))))


class Net(nn.Module):
    def __init__(self, dim: int, depth: int) -> None:
        super().__init__()
        self.embed = nn.Linear(dim, dim)
        self.blocks = nn.ModuleList(Block(dim) for _ in range(depth))
        self.head = nn.Linear(dim, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.embed(x)
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--dim", type=int, default=128)
    parser.add_argument("--depth", type=int, default=6)
    parser.add_argument("--steps", type=int, default=2)
    args = parser.parse_args()
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    dist.init_process_group(backend)
    device = (
        torch.device("cuda", dist.get_rank() % max(torch.cuda.device_count(), 1))
        if backend == "nccl"
        else torch.device("cpu")
    )
    torch.manual_seed(0)
    with st.watch(name="fsdp1-no-wrap-policy"):
        model = Net(args.dim, args.depth)
        st.attach(model, stage="setup", strategy="FullyShardedDataParallel", engine="fsdp1")
        model = FSDP(model, device_id=device)  # no auto_wrap_policy: one unit
        optimizer = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)
        st.attach(model, optimizer=optimizer)
        for step in range(1, args.steps + 1):
            x = torch.randn(16, args.dim, device=device)
            st.phase("forward", step)
            loss = model(x).square().mean()
            st.phase("backward")
            loss.backward()
            st.phase("optimizer")
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            st.step(step, loss=loss.item())
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
