"""A user's own Lightning script: DDP on two CPU processes started by Lightning itself,
with nothing of shardtop but the callback."""

import lightning as L
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from shardtop import ShardtopCallback


class Regressor(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 1))

    def training_step(self, batch, batch_idx):
        x, y = batch
        return nn.functional.mse_loss(self.net(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


if __name__ == "__main__":
    data = TensorDataset(torch.randn(64, 16), torch.randn(64, 1))
    trainer = L.Trainer(
        accelerator="cpu", devices=2, strategy="ddp", max_steps=3, logger=False,
        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
        callbacks=[ShardtopCallback()],
    )
    trainer.fit(Regressor(), DataLoader(data, batch_size=8))
