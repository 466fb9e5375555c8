"""What every Lightning preset shares: the trainer, the data, the callback."""

from __future__ import annotations

from typing import Any

import lightning as L
import torch
from torch import nn

from shardtop.probe.callback import ShardtopCallback
from shardtop.runner.context import RankContext
from shardtop.runner.data import regression_loader


class RegressionModule(L.LightningModule):
    """Mean-squared error on synthetic data; subclasses build ``self.model``."""

    model: nn.Module | None
    """Built by the subclass in ``__init__``, or in ``configure_model`` (None until then)."""

    def __init__(self, lr: float = 1e-3) -> None:
        super().__init__()
        self.lr = lr

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        if self.model is None:  # Lightning calls configure_model before the first step
            raise RuntimeError("training_step() ran before configure_model() built self.model")
        return nn.functional.mse_loss(self.model(x), y)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self.parameters(), lr=self.lr)


def fit(ctx: RankContext, module: L.LightningModule, strategy: Any, features: int, **trainer_kwargs: Any) -> None:
    """Fit a regression module on synthetic data of ``features`` columns."""
    cfg = ctx.config
    loader = regression_loader(cfg["max_steps"], cfg["batch_size"], features, cfg.get("seed", 0))
    fit_module(ctx, module, strategy, loader, **trainer_kwargs)


def fit_module(ctx: RankContext, module: L.LightningModule, strategy: Any, loader: Any, **trainer_kwargs: Any) -> None:
    cfg = ctx.config
    torch.manual_seed(cfg.get("seed", 0))
    trainer = L.Trainer(
        accelerator=ctx.accelerator,
        devices=ctx.world_size,
        num_nodes=1,
        strategy=strategy,
        max_steps=cfg["max_steps"],
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[ShardtopCallback(program=cfg["preset"])],
        **trainer_kwargs,
    )
    trainer.fit(module, loader)
