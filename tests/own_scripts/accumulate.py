"""A user's plain loop with gradient accumulation: two micro-batches, then one optimizer step (nothing of
shardtop in it).

    python tests/own_scripts/accumulate.py [--steps 3] [--micro 2]
"""

from __future__ import annotations

import argparse

import torch


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--micro", type=int, default=2)
    args = parser.parse_args()
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
    optimizer = torch.optim.AdamW(model.parameters())
    for _ in range(args.steps):
        for _ in range(args.micro):
            model(torch.randn(8, 16)).pow(2).mean().backward()
        optimizer.step()
        optimizer.zero_grad()


if __name__ == "__main__":
    main()
