"""A user's own plain loop whose dataloader workers call a module: the workers are no ranks.

Each sample goes through an ``nn.Module`` transform inside the workers: one
worker started by fork, one by spawn (a fresh interpreter).  Nothing of
shardtop in it.

    python tests/own_scripts/dataloader_train.py
"""

from __future__ import annotations

import os

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset


class Noisy(Dataset):
    def __init__(self) -> None:
        self.transform = nn.Linear(8, 8)

    def __len__(self) -> int:
        return 4

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        with torch.no_grad():
            return self.transform(torch.randn(8)), torch.randn(1)


def main() -> None:
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    for context in ("fork", "spawn"):
        loader = DataLoader(Noisy(), batch_size=2, num_workers=1, multiprocessing_context=context)
        for x, y in loader:
            loss = nn.functional.mse_loss(model(x), y)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
    print(f"trained in process {os.getpid()}", flush=True)


if __name__ == "__main__":
    main()
