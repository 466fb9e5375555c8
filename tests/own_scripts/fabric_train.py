"""A user's own Lightning Fabric loop on two CPU processes, as litgpt writes one: the data is made under
``fabric.rank_zero_first()`` (rank 0 first, the others after a barrier), the model is set up by the
strategy, then the optimizer.  Nothing of shardtop in it.

    python tests/own_scripts/fabric_train.py
"""

from __future__ import annotations

import argparse

import lightning as L
import torch
from torch import nn


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--devices", type=int, default=2)
    parser.add_argument("--steps", type=int, default=3)
    args = parser.parse_args()
    fabric = L.Fabric(accelerator="cpu", devices=args.devices, strategy="ddp")
    fabric.launch()
    fabric.seed_everything(0)
    with fabric.rank_zero_first():  # rank 0 prepares the data before the others read it
        data = torch.randn(64, 32)
    model = fabric.setup_module(nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 1)))
    optimizer = fabric.setup_optimizers(torch.optim.AdamW(model.parameters(), lr=1e-3))
    for step in range(1, args.steps + 1):
        batch = data[step * 4: step * 4 + 4]
        loss = model(batch).pow(2).mean()
        fabric.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
        fabric.print(f"step {step} loss {loss.item():.6f}")


if __name__ == "__main__":
    main()
