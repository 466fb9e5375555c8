"""fsdp-not-sharding, fsdp-auto-wrap, ddp-baseline: story 1 and its answers.

As asked (fsdp-not-sharding): Lightning ``FSDPStrategy(auto_wrap_policy=None,
cpu_offload=True, mixed_precision=fp16)`` under ``Trainer(precision=32)``, with
four transformer stacks wrapped by hand in the deprecated
``configure_sharded_model`` through ``self.trainer.model``.  Overriding that
hook makes Lightning neither wrap the root nor move the model: only the four
stacks become FSDP units, every other layer stays whole on the CPU of every
rank — so, like the question's own code, the first forward moves those stray
layers to the GPU by hand.

On CPU, where Lightning's FSDPStrategy refuses to run, the same wrapping is
done with raw FSDP1 (``enable_wrap``/``wrap``, exactly what the strategy's
``model_sharded_context`` does).  ddp-baseline runs Lightning DDP everywhere.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import lightning as L
import torch
from torch import nn

from shardtop.runner.context import RankContext
from shardtop.runner.lightning_run import fit_module
from shardtop.runner.models import PatchSegmenter, TransformerBlock

HAND_WRAPPED = ("transformers1", "transformer_0", "transformer_1", "transformers_out")
STRAY = ("conv1", "bn1", "conv2", "bn2", "conv_out", "out_layer")


def build_segmenter(m: Mapping[str, int]) -> PatchSegmenter:
    return PatchSegmenter(
        dim=m["dim"], depth=m["depth"], stem_depth=m["stem_depth"], heads=m["heads"],
        patch=m["patch"], channels=m["channels"], classes=m["classes"],
    )


class Segmentation(L.LightningModule):
    """The question's LightningModule: the segmenter's layers are its own attributes."""

    conv1: nn.Conv2d
    """Set in ``__init__`` with the segmenter's other layers; named here for the stray-layer check."""

    def __init__(self, m: Mapping[str, int], lr: float = 1e-3) -> None:
        super().__init__()
        for name, child in build_segmenter(m).named_children():
            setattr(self, name, child)
        self.patch = m["patch"]
        self.lr = lr

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return PatchSegmenter.forward(self, x)  # type: ignore[arg-type]

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        return nn.functional.cross_entropy(self(x).float(), y)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        model = self.trainer.model
        if model is None:  # the strategy has set it up before Lightning asks for the optimizers
            raise RuntimeError("configure_optimizers() ran before the strategy set up trainer.model")
        return torch.optim.SGD(model.parameters(), lr=self.lr, momentum=0.3)


class SegmentationHandWrapped(Segmentation):
    """As asked: the deprecated hook, wrapping through ``self.trainer.model``."""

    def configure_sharded_model(self) -> None:
        from torch.distributed.fsdp.wrap import wrap

        for name in HAND_WRAPPED:
            setattr(self.trainer.model, name, wrap(getattr(self.trainer.model, name)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # The question's workaround: Lightning left these on the CPU.
        if self.conv1.weight.device != x.device:
            for name in STRAY:
                getattr(self, name).to(x.device)
        return super().forward(x)


def fp16_mixed_precision() -> Any:
    from torch.distributed.fsdp import MixedPrecision

    return MixedPrecision(param_dtype=torch.float16, reduce_dtype=torch.float16, buffer_dtype=torch.float16)


def run(ctx: RankContext) -> None:
    program = ctx.config["program"]
    m = ctx.config["model"]
    if program == "ddp-baseline":
        from lightning.pytorch.strategies import DDPStrategy

        fit_segmentation(ctx, Segmentation(m), DDPStrategy(), precision="32-true")
    elif ctx.accelerator == "cuda":
        from lightning.pytorch.strategies import FSDPStrategy

        if program == "fsdp-not-sharding":
            strategy = FSDPStrategy(auto_wrap_policy=None, cpu_offload=True, mixed_precision=fp16_mixed_precision())
            fit_segmentation(ctx, SegmentationHandWrapped(m), strategy, precision="32-true")
        else:
            strategy = FSDPStrategy(auto_wrap_policy={TransformerBlock})
            fit_segmentation(ctx, Segmentation(m), strategy, precision="16-mixed")
    else:
        run_raw_fsdp1(ctx, hand_wrapped=program == "fsdp-not-sharding")


def fit_segmentation(ctx: RankContext, module: L.LightningModule, strategy: Any, precision: str) -> None:
    from shardtop.runner.data import segmentation_loader

    m, cfg = ctx.config["model"], ctx.config
    loader = segmentation_loader(cfg["max_steps"], cfg["batch_size"], m["image"], m["classes"], cfg.get("seed", 0))
    fit_module(ctx, module, strategy, loader, precision=precision)


def run_raw_fsdp1(ctx: RankContext, hand_wrapped: bool) -> None:
    """The same wrapping with raw FSDP1 on CPU processes (gloo)."""
    from torch.distributed.fsdp import CPUOffload
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    from torch.distributed.fsdp.wrap import ModuleWrapPolicy, enable_wrap, wrap

    import shardtop.probe as st
    from shardtop.runner.data import segmentation_loader
    from shardtop.runner.raw_run import init_process_group, train

    cfg, m = ctx.config, ctx.config["model"]
    torch.manual_seed(cfg.get("seed", 0))
    init_process_group(ctx)
    cpu = torch.device("cpu")
    with st.watch(name=cfg["preset"]) as probe:
        model = build_segmenter(m)
        if hand_wrapped:
            # cpu_offload=True cannot be honoured here: FSDP pins offloaded shards, which needs a GPU.
            probe.extra_info.update({
                "precision": "32-true", "loss_scaling": False, "cpu_offload_requested": True,
                "driver": "raw FSDP1 wrap() as in configure_sharded_model (Lightning refuses CPU)",
            })
            st.attach(model, stage="setup", strategy="FSDPStrategy", engine="fsdp1")
            with enable_wrap(wrapper_cls=FSDP, cpu_offload=CPUOffload(offload_params=False),
                             mixed_precision=fp16_mixed_precision(), device_id=cpu):
                for name in HAND_WRAPPED:
                    setattr(model, name, wrap(getattr(model, name)))
            wrapped: nn.Module = model
        else:
            probe.extra_info.update({"precision": "32-true", "loss_scaling": False,
                                     "driver": "raw FSDP1 with an auto-wrap policy (Lightning refuses CPU)"})
            st.attach(model, stage="setup", strategy="FSDPStrategy", engine="fsdp1")
            wrapped = FSDP(model, auto_wrap_policy=ModuleWrapPolicy({TransformerBlock}), device_id=cpu)
        optimizer = torch.optim.SGD(wrapped.parameters(), lr=1e-3, momentum=0.3)
        st.attach(wrapped, optimizer=optimizer)
        loader = segmentation_loader(cfg["max_steps"], cfg["batch_size"], m["image"], m["classes"], cfg.get("seed", 0))

        def step() -> None:
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)

        train(ctx, loader, lambda b: nn.functional.cross_entropy(wrapped(b[0]).float(), b[1]),
              lambda value: value.backward(), step, lambda: st.attach(wrapped, optimizer=optimizer, stage="step"))
