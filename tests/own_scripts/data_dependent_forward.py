"""A plain training loop whose model reads a value out of a tensor in its forward (``.item()``), as a model
that picks its path from the data does: a forward traced on the meta device, where no tensor holds a value,
cannot run it.

    python tests/own_scripts/data_dependent_forward.py [--steps N]
"""

from __future__ import annotations

import argparse

import torch
from torch import nn


class Gated(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.first = nn.Linear(32, 64)
        self.second = nn.Linear(64, 32)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        hidden = torch.relu(self.first(x))
        if hidden.mean().item() > 10.0:  # the data picks the path
            hidden = hidden / 10.0
        return self.second(hidden)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=4)
    args = parser.parse_args()
    torch.manual_seed(0)
    model = Gated()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for _ in range(args.steps):
        loss = model(torch.randn(8, 32)).pow(2).mean()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    print(f"final loss={float(loss)!r}")


if __name__ == "__main__":
    main()
