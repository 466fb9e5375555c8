"""A user's own training script for one engine of six, as torchrun starts it: nothing of shardtop in it.

    torchrun --standalone --nproc_per_node 2 tests/own_scripts/rehearse_engines.py --engine fsdp1
    DS_ACCELERATOR=cpu torchrun --standalone --nproc_per_node 2 tests/own_scripts/rehearse_engines.py --engine zero3

``--engine`` is ``fsdp1`` (one unit per block and one for the root,
``device_id`` the CPU), ``fsdp2`` (``fully_shard`` per block and the root),
``ddp``, or DeepSpeed ``zero1``, ``zero2``, ``zero3`` (a client torch
optimizer; ZeRO-3 partitions every parameter,
``stage3_param_persistence_threshold`` 0).  The optimizer is SGD with
momentum: one state tensor per parameter, as large as it.  The sizes are
uneven on purpose (``--dim 22 --hidden 21``): the flat units of FSDP1 (1011
and 575 elements), the hidden and output rows (21, 3) and the whole model
(2597 elements) divide by none of 2, 8 or 64, so the last ranks' shards are
short or empty.  Gloo on CPU; the script leaves with ``os._exit(0)`` once its
output is flushed, since gloo's teardown at interpreter exit aborts now and
then.
"""

from __future__ import annotations

import argparse
import os
import sys

import torch
import torch.distributed as dist
from torch import nn

ENGINES = ("fsdp1", "fsdp2", "ddp", "zero1", "zero2", "zero3")


class Block(nn.Module):
    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.up = nn.Linear(dim, hidden)
        self.down = nn.Linear(hidden, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = x + self.down(torch.relu(self.up(self.norm(x))))
        return out


class Net(nn.Module):
    def __init__(self, dim: int, hidden: int, depth: int) -> None:
        super().__init__()
        self.embed = nn.Linear(dim, dim)
        self.blocks = nn.Sequential(*(Block(dim, hidden) for _ in range(depth)))
        self.head = nn.Linear(dim, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.head(self.blocks(self.embed(x)))
        return out


def fsdp1(model: Net) -> tuple[nn.Module, torch.optim.Optimizer]:
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    cpu = torch.device("cpu")
    for i, block in enumerate(model.blocks):
        model.blocks[i] = FSDP(block, device_id=cpu)
    wrapped = FSDP(model, device_id=cpu)
    return wrapped, torch.optim.SGD(wrapped.parameters(), lr=1e-3, momentum=0.9)


def fsdp2(model: Net) -> tuple[nn.Module, torch.optim.Optimizer]:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    for block in model.blocks:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model, torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)


def ddp(model: Net) -> tuple[nn.Module, torch.optim.Optimizer]:
    from torch.nn.parallel import DistributedDataParallel as DDP

    wrapped = DDP(model)
    return wrapped, torch.optim.SGD(wrapped.parameters(), lr=1e-3, momentum=0.9)


def zero(model: Net, stage: int) -> tuple[nn.Module, torch.optim.Optimizer]:
    import deepspeed

    deepspeed.init_distributed(dist_backend="gloo")
    config = {
        "train_micro_batch_size_per_gpu": 4,
        "zero_optimization": {"stage": stage, "stage3_param_persistence_threshold": 0},
        "zero_allow_untested_optimizer": True,
        "steps_per_print": 10**9,
    }
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)
    engine, optimizer, _, _ = deepspeed.initialize(model=model, optimizer=optimizer, config=config)
    return engine, optimizer


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--engine", choices=ENGINES, required=True)
    parser.add_argument("--dim", type=int, default=22)
    parser.add_argument("--hidden", type=int, default=21)
    parser.add_argument("--depth", type=int, default=2)
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--local_rank", type=int, default=0)  # the deepspeed launcher passes it
    args = parser.parse_args()
    torch.set_num_threads(1)
    if not args.engine.startswith("zero"):
        dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = Net(args.dim, args.hidden, args.depth)
    if args.engine.startswith("zero"):
        wrapped, optimizer = zero(model, int(args.engine[-1]))
    else:
        wrapped, optimizer = {"fsdp1": fsdp1, "fsdp2": fsdp2, "ddp": ddp}[args.engine](model)
    for _ in range(args.steps):
        x, y = torch.randn(4, args.dim), torch.randn(4, 3)
        loss = nn.functional.mse_loss(wrapped(x), y)
        if args.engine.startswith("zero"):
            wrapped.backward(loss)  # type: ignore[operator]
            wrapped.step()  # type: ignore[operator]
        else:
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
    print(f"rank {dist.get_rank()} of {dist.get_world_size()}: {args.steps} steps, loss {loss.item():.4f}", flush=True)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
