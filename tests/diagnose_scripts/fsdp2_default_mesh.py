"""Lightning ``ModelParallelStrategy()`` with its default mesh: FSDP2 shards nothing.

The LightningModule shards its blocks with ``fully_shard`` over
``self.device_mesh["data_parallel"]``, as Lightning's FSDP2 guide shows; the
strategy is left at its defaults.  On one node those put every process on the
tensor-parallel axis, so the data-parallel axis has size 1 and every rank
holds the whole model.  Lightning starts the ranks itself:

    python tests/diagnose_scripts/fsdp2_default_mesh.py --devices 2
"""

from __future__ import annotations

import argparse
from typing import Any

import lightning as L
import torch
from lightning.pytorch.strategies import ModelParallelStrategy
from torch import nn
from torch.distributed.fsdp import fully_shard
from torch.utils.data import DataLoader, TensorDataset

from shardtop import ShardtopCallback


class Block(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.fc = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.fc(self.norm(x))


class Regressor(L.LightningModule):
    def __init__(self, dim: int, depth: int) -> None:
        super().__init__()
        self.model = nn.Sequential(*(Block(dim) for _ in range(depth)), nn.Linear(dim, 1))

    def configure_model(self) -> None:
        mesh = self.device_mesh["data_parallel"]
        for layer in self.model:
            fully_shard(layer, mesh=mesh)
        fully_shard(self.model, mesh=mesh)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        return nn.functional.mse_loss(self.model(x), y)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=1e-3)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--devices", type=int, default=2)
    parser.add_argument("--dim", type=int, default=128)
    parser.add_argument("--depth", type=int, default=4)
    parser.add_argument("--steps", type=int, default=2)
    args = parser.parse_args()
    torch.manual_seed(0)
    data = TensorDataset(torch.randn(8 * args.steps, args.dim), torch.randn(8 * args.steps, 1))
    trainer = L.Trainer(
        accelerator="cpu",
        devices=args.devices,
        strategy=ModelParallelStrategy(),  # the defaults: data_parallel_size="auto", tensor_parallel_size="auto"
        max_steps=args.steps,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[ShardtopCallback()],
    )
    trainer.fit(Regressor(args.dim, args.depth), DataLoader(data, batch_size=8))


if __name__ == "__main__":
    main()
