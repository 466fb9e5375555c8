"""A user's own plain training loop whose ``decoder.1.expand`` asks for far more memory than there is.

One process, no engine, nothing of shardtop in it.  ``Expand.forward``
allocates ``--ask`` bytes (64 TiB by default): the allocator refuses it
("DefaultCPUAllocator: can't allocate memory"), the error reaches the top and
Python exits with 1.

    python tests/own_scripts/oom_in_module.py
"""

from __future__ import annotations

import argparse

import torch
from torch import nn


class Expand(nn.Module):
    def __init__(self, dim: int, ask: int) -> None:
        super().__init__()
        self.proj = nn.Linear(dim, dim)
        self.ask = ask

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        scratch = torch.empty(self.ask // 4, dtype=torch.float32, device=x.device)  # the allocation that fails
        return self.proj(x) + scratch[:1]


class Model(nn.Module):
    def __init__(self, dim: int, ask: int) -> None:
        super().__init__()
        self.encoder = nn.Sequential(nn.Linear(dim, dim), nn.ReLU())
        self.decoder = nn.Sequential(nn.Linear(dim, dim), Expand(dim, ask), nn.Linear(dim, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.decoder(self.encoder(x))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--dim", type=int, default=32)
    parser.add_argument("--ask", type=int, default=64 << 40)
    parser.add_argument("--cuda", action="store_true",
                        help="train on the GPU (a CUDA OOM instead of the CPU allocator's)")
    args = parser.parse_args()
    device = torch.device("cuda" if args.cuda else "cpu")
    model = Model(args.dim, args.ask).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    for _ in range(2):
        loss = model(torch.randn(4, args.dim, device=device)).pow(2).mean()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()


if __name__ == "__main__":
    main()
