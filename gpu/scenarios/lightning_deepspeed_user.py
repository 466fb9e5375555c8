"""A user's own Lightning + DeepSpeed script: nothing of shardtop in it, run under ``shardtop run``.

A small GPT-style language model (token embedding, N transformer blocks, a head)
trained with ``strategy="deepspeed_stage_3"`` and bf16, the blocks built in
``configure_model()`` as Lightning recommends for ZeRO-3, on random tokens:

    shardtop run --headless -- python gpu/scenarios/lightning_deepspeed_user.py --devices 1
    shardtop run --headless -- python gpu/scenarios/lightning_deepspeed_user.py --strategy fsdp --precision bf16-true

shardtop injects its probe into the rank (Lightning's Trainer gets the callback),
so the run has its shard tree, memory and findings without a line changed here.
"""

from __future__ import annotations

import argparse

import lightning as L
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


class Block(nn.Module):
    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(width)
        self.attn = nn.MultiheadAttention(width, heads, batch_first=True)
        self.norm2 = nn.LayerNorm(width)
        self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.norm1(x)
        x = x + self.attn(h, h, h, need_weights=False)[0]
        return x + self.mlp(self.norm2(x))


class TinyGpt(L.LightningModule):
    def __init__(self, vocab: int, width: int, layers: int, heads: int) -> None:
        super().__init__()
        self.save_hyperparameters()

    def configure_model(self) -> None:
        hp = self.hparams
        if hasattr(self, "blocks"):
            return
        self.embed = nn.Embedding(hp.vocab, hp.width)
        self.blocks = nn.ModuleList(Block(hp.width, hp.heads) for _ in range(hp.layers))
        self.head = nn.Linear(hp.width, hp.vocab)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens)
        for block in self.blocks:
            x = block(x)
        return self.head(x)

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        tokens, targets = batch
        logits = self(tokens)
        return nn.functional.cross_entropy(logits.flatten(0, 1), targets.flatten())

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self.parameters(), lr=3e-4)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--devices", type=int, default=1)
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--width", type=int, default=1024)
    parser.add_argument("--vocab", type=int, default=32000)
    parser.add_argument("--seq", type=int, default=512)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--strategy", default="deepspeed_stage_3", help="any Lightning strategy: fsdp, ddp...")
    parser.add_argument("--precision", default="bf16-mixed", help="bf16-true keeps the parameters in bf16")
    args = parser.parse_args()
    tokens = torch.randint(0, args.vocab, (args.batch * args.steps, args.seq + 1))
    data = TensorDataset(tokens[:, :-1], tokens[:, 1:])
    model = TinyGpt(args.vocab, args.width, args.layers, heads=16)
    trainer = L.Trainer(
        accelerator="cuda", devices=args.devices, strategy=args.strategy, precision=args.precision,
        max_steps=args.steps, logger=False, enable_checkpointing=False, enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(model, DataLoader(data, batch_size=args.batch))


if __name__ == "__main__":
    main()
