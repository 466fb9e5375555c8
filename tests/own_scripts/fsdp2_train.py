"""A user's own FSDP2 script, as torchrun starts it: nothing of shardtop in it.

    torchrun --standalone --nproc_per_node 2 tests/own_scripts/fsdp2_train.py

``--optimizer-in-backward`` gives each parameter an AdamW of its own, stepped
from the parameter's post-accumulate-grad hook as the gradient arrives
(torch's "optimizer step in backward" recipe; torchtune's ``optimizer_in_bwd``).

``--os-exit`` leaves with ``os._exit(0)`` after the last step, as many gloo
scripts do: gloo's teardown at interpreter exit aborts now and then
("terminate called without an active exception").
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
        self.fc = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.fc(self.norm(x))


class Net(nn.Module):
    def __init__(self, dim: int, depth: int) -> None:
        super().__init__()
        self.blocks = nn.Sequential(*(Block(dim) for _ in range(depth)))
        self.head = nn.Linear(dim, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.blocks(x))


def step_in_backward(model: nn.Module) -> None:
    optimizers = {param: torch.optim.AdamW([param]) for param in model.parameters()}

    def step(param: torch.Tensor) -> None:
        optimizers[param].step()
        optimizers[param].zero_grad()

    for param in model.parameters():
        param.register_post_accumulate_grad_hook(step)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--os-exit", action="store_true")
    parser.add_argument("--cuda", action="store_true", help="NCCL on one GPU per rank instead of gloo on CPU")
    parser.add_argument("--compile", action="store_true", help="torch.compile the model after fully_shard")
    parser.add_argument("--keep-whole", choices=["root", "all", "head"], default=None,
                        help="reshard_after_forward=False for the root (as accelerate and torchtitan do), for all, "
                             "or for the head in a unit of its own (as accelerate keeps the last norm and head)")
    parser.add_argument("--optimizer-in-backward", action="store_true",
                        help="an AdamW per parameter, stepped in backward as each gradient arrives")
    args = parser.parse_args()
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0"))) if args.cuda else torch.device("cpu")
    if args.cuda:
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if args.cuda else "gloo")
    mesh = init_device_mesh(device.type, (dist.get_world_size(),))
    torch.manual_seed(0)
    model = Net(args.dim, depth=3).to(device)
    for block in model.blocks:
        fully_shard(block, mesh=mesh, reshard_after_forward=args.keep_whole != "all")
    if args.keep_whole == "head":
        fully_shard(model.head, mesh=mesh, reshard_after_forward=False)
    fully_shard(model, mesh=mesh, reshard_after_forward=args.keep_whole in (None, "head"))
    if args.compile:
        model = torch.compile(model)
    optimizer = None if args.optimizer_in_backward else torch.optim.SGD(model.parameters(), lr=0.01)
    if args.optimizer_in_backward:
        step_in_backward(model)
    for _ in range(args.steps):
        x, y = torch.randn(8, args.dim, device=device), torch.randn(8, 1, device=device)
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        if optimizer is not None:
            optimizer.step()
            optimizer.zero_grad()
    dist.destroy_process_group()
    if args.os_exit:
        os._exit(0)


if __name__ == "__main__":
    main()
