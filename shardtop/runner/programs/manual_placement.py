"""manual-placement: story 1's own fallback, one process, the model split over two devices.

The first half of the segmenter lives on the first device, the second half on
the second; activations are moved between them in ``forward``.  With two GPUs
that is ``cuda:0`` + ``cuda:1``; with one GPU the second half stays on the
CPU; without GPUs both halves share the CPU (the run says so).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

import shardtop.probe as st
from shardtop.runner.context import RankContext
from shardtop.runner.models import PatchSegmenter
from shardtop.runner.programs.fsdp_story import build_segmenter

FIRST_HALF = ("conv1", "bn1", "relu", "transformers1", "conv2", "bn2", "transformer_0")
SECOND_HALF = ("transformer_1", "transformers_out", "conv_out", "out_layer")


def placement(gpus: int) -> tuple[torch.device, torch.device]:
    if gpus >= 2:
        return torch.device("cuda:0"), torch.device("cuda:1")
    if gpus == 1:
        return torch.device("cuda:0"), torch.device("cpu")
    return torch.device("cpu"), torch.device("cpu")


class SplitSegmenter(nn.Module):
    """The segmenter with its halves on two devices, activations carried across."""

    def __init__(self, model: PatchSegmenter, first: torch.device, second: torch.device) -> None:
        super().__init__()
        self.model = model
        self.first, self.second = first, second
        for name in FIRST_HALF:
            getattr(model, name).to(first)
        for name in SECOND_HALF:
            getattr(model, name).to(second)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        m = self.model
        x = m.relu(m.bn1(m.conv1(x.to(self.first))))
        x = m.relu(m.bn2(m.conv2(x)))
        n, d, h, w = x.shape
        tokens = m.transformer_0(m.transformers1(x.flatten(2).transpose(1, 2)))
        tokens = m.transformers_out(m.transformer_1(tokens.to(self.second)))
        x = tokens.transpose(1, 2).reshape(n, d, h, w)
        logits: torch.Tensor = m.out_layer(m.relu(m.conv_out(x)))
        return logits


def run(ctx: RankContext) -> None:
    from shardtop.runner.data import segmentation_loader
    from shardtop.runner.raw_run import train

    cfg, m = ctx.config, ctx.config["model"]
    gpus = torch.cuda.device_count() if ctx.accelerator == "cuda" else 0
    first, second = placement(min(gpus, cfg["devices"]))
    if first == second:
        print("manual-placement: no two devices to split over here; both halves share the "
              f"{first}. With two GPUs the halves go to cuda:0 and cuda:1.", flush=True)
    torch.manual_seed(cfg.get("seed", 0))
    with st.watch(name=cfg["preset"]) as probe:
        probe.extra_info.update({"placement": f"{FIRST_HALF[0]}..{FIRST_HALF[-1]} on {first}; "
                                 f"{SECOND_HALF[0]}..{SECOND_HALF[-1]} on {second}"})
        model = SplitSegmenter(build_segmenter(m), first, second)
        optimizer = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.3)
        st.attach(model, optimizer=optimizer, strategy="manual placement (module.to)", engine="manual")
        loader = segmentation_loader(cfg["max_steps"], cfg["batch_size"], m["image"], m["classes"], cfg.get("seed", 0))

        def step() -> None:
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)

        def loss(batch: Any) -> torch.Tensor:
            x, y = batch
            return nn.functional.cross_entropy(model(x).float(), y.to(second))

        train(ctx, loader, loss, lambda value: value.backward(), step,
              lambda: st.attach(model, optimizer=optimizer, stage="step"))
