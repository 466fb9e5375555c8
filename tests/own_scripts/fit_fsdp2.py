"""A user's own FSDP2 script whose micro-batch is a command-line flag: what ``shardtop fit`` searches.

    torchrun --standalone --nproc_per_node 2 tests/own_scripts/fit_fsdp2.py --batch-size 8 --steps 2

Blocks of a pre-norm MLP over sequences, each block a ``fully_shard`` unit and the root one too, SGD
with momentum.  Its activations grow with ``--batch-size`` (``--seq`` × ``--dim`` floats a sample and
block, four times that in the MLP), so under a memory cap one more sample can be what runs out.
``--cuda``: NCCL on one GPU per rank instead of gloo on CPU.
"""

from __future__ import annotations

import argparse
import os

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard


class Block(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.up = nn.Linear(dim, 4 * dim)
        self.down = nn.Linear(4 * dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(nn.functional.gelu(self.up(self.norm(x))))


class Net(nn.Module):
    def __init__(self, dim: int, depth: int) -> None:
        super().__init__()
        self.blocks = nn.Sequential(*(Block(dim) for _ in range(depth)))
        self.head = nn.Linear(dim, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.blocks(x))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--dim", type=int, default=256)
    parser.add_argument("--depth", type=int, default=4)
    parser.add_argument("--seq", type=int, default=64)
    parser.add_argument("--cuda", action="store_true", help="NCCL on one GPU per rank instead of gloo on CPU")
    args = parser.parse_args()
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0"))) if args.cuda else torch.device("cpu")
    if args.cuda:
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if args.cuda else "gloo")
    mesh = init_device_mesh(device.type, (dist.get_world_size(),))
    torch.manual_seed(0)
    model = Net(args.dim, args.depth).to(device)
    for block in model.blocks:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    for _ in range(args.steps):
        x = torch.randn(args.batch_size, args.seq, args.dim, device=device)
        y = torch.randn(args.batch_size, args.seq, 1, device=device)
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
