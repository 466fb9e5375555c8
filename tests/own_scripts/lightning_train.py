"""A user's own Lightning script, with no callback and nothing of shardtop in it.

Lightning starts the second rank itself (DDP on two CPU processes):

    python tests/own_scripts/lightning_train.py [PRECISION]    (bf16-true: the model kept in bf16)
"""

from __future__ import annotations

import sys

import lightning as L
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


class Regressor(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 1))

    def training_step(self, batch, batch_idx):  # type: ignore[no-untyped-def]
        x, y = batch
        return nn.functional.mse_loss(self.net(x), y)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)


if __name__ == "__main__":
    data = TensorDataset(torch.randn(64, 16), torch.randn(64, 1))
    trainer = L.Trainer(
        accelerator="cpu", devices=2, strategy="ddp", max_steps=2, logger=False,
        precision=sys.argv[1] if len(sys.argv) > 1 else "32-true",
        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
    )
    trainer.fit(Regressor(), DataLoader(data, batch_size=8))
