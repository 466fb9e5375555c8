"""zero3-linear and zero3-linear-fixed: story 2.

As asked, an ``nn.Sequential`` of ``n_layers`` ``nn.Linear(512, 512)`` is
built in ``__init__``; DeepSpeed then moves the whole model to every GPU in
``DeepSpeedEngine._configure_distributed_model`` before ZeRO-3 partitions it.
Fixed, the layers are built in ``configure_model()``, inside
``deepspeed.zero.Init``, so each rank only ever holds its partition.

On GPUs this runs Lightning's ``DeepSpeedStrategy`` (stage 3) as the question
did; on CPU, where Lightning refuses DeepSpeed, it drives
``deepspeed.initialize`` directly the same way.  A CPU rank has no device to
move the model to: the whole model costs it memory as it is built, so the
layers as asked are allocated one by one in ``__init__`` (``SequentialLinear``'s
``layer_by_layer``), and under a cap the layer that no longer fits runs out.

``zero.offload_optimizer=cpu`` and ``zero.offload_param=cpu`` become DeepSpeed's
``offload_optimizer`` / ``offload_param`` sections (Lightning's ``offload_optimizer`` /
``offload_parameters`` on GPUs).  The optimizer stays torch's AdamW, stepped by
DeepSpeed on the offloaded fp32 partitions (``zero_force_ds_cpu_optimizer: false``):
DeepSpeedCPUAdam would step faster, but it compiles a C++ extension on first
use.  On CPU processes the offloaded state stays in the rank's own memory.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from shardtop.config import ZeroOffload, zero_offload
from shardtop.runner.context import RankContext
from shardtop.runner.lightning_run import RegressionModule, fit
from shardtop.runner.models import SequentialLinear


class LinearStackAsAsked(RegressionModule):
    """The question's model: the layers exist before the strategy sees them."""

    def __init__(self, n_layers: int, width: int) -> None:
        super().__init__()
        self.model = SequentialLinear(n_layers, width)


class LinearStackFixed(RegressionModule):
    """The fix: layers built in ``configure_model``, under ``deepspeed.zero.Init``."""

    def __init__(self, n_layers: int, width: int) -> None:
        super().__init__()
        self.n_layers, self.width = n_layers, width
        self.model: nn.Module | None = None

    def configure_model(self) -> None:
        if self.model is None:
            self.model = SequentialLinear(self.n_layers, self.width)


def deepspeed_config(ctx: RankContext) -> dict[str, object]:
    offload = zero_offload(ctx.config)
    zero: dict[str, object] = {"stage": 3}
    if offload.optimizer != "none":
        zero["offload_optimizer"] = {"device": offload.optimizer}
    if offload.param != "none":
        zero["offload_param"] = {"device": offload.param}
    return {
        "train_micro_batch_size_per_gpu": ctx.config["batch_size"],
        "gradient_accumulation_steps": 1,
        "zero_optimization": zero,
        "zero_allow_untested_optimizer": True,
        **without_cpu_adam(offload),
        "steps_per_print": 10**9,
        "wall_clock_breakdown": False,
    }


def without_cpu_adam(offload: ZeroOffload) -> dict[str, Any]:
    """What lets DeepSpeed step torch's AdamW on offloaded state: it refuses any optimizer but its own
    CPU ones there unless told not to."""
    return {"zero_force_ds_cpu_optimizer": False} if offload.optimizer != "none" else {}


def lightning_strategy(ctx: RankContext) -> Any:
    """Lightning's ``DeepSpeedStrategy`` at stage 3, offloading what the preset's keys say."""
    from lightning.pytorch.strategies import DeepSpeedStrategy

    offload = zero_offload(ctx.config)
    strategy = DeepSpeedStrategy(
        stage=3,
        offload_optimizer=offload.optimizer != "none",
        offload_optimizer_device=offload.optimizer if offload.optimizer != "none" else "cpu",
        offload_parameters=offload.param != "none",
        offload_params_device=offload.param if offload.param != "none" else "cpu",
    )
    config = strategy.config
    if config is None:  # made from the arguments above whenever no config file or dict is given
        raise RuntimeError("Lightning's DeepSpeedStrategy made no DeepSpeed config from its arguments")
    config.update(without_cpu_adam(offload))
    return strategy


def run(ctx: RankContext) -> None:
    m = ctx.config["model"]
    fixed = ctx.config["program"] == "zero3-linear-fixed"
    if ctx.accelerator == "cuda":
        cls = LinearStackFixed if fixed else LinearStackAsAsked
        fit(ctx, cls(m["n_layers"], m["width"]), lightning_strategy(ctx), features=m["width"], precision="32-true")
    else:
        run_raw(ctx, fixed)


def run_raw(ctx: RankContext, fixed: bool) -> None:
    import deepspeed

    import shardtop.probe as st
    from shardtop.runner.data import regression_loader
    from shardtop.runner.raw_run import batches_to, train

    m = ctx.config["model"]
    torch.manual_seed(ctx.config.get("seed", 0))
    deepspeed.init_distributed(dist_backend="gloo", auto_mpi_discovery=False)
    config = deepspeed_config(ctx)
    with st.watch(name=ctx.config["preset"]) as probe:
        probe.extra_info.update({"precision": "32-true", "driver": "deepspeed.initialize (Lightning refuses CPU)"})
        if fixed:
            with deepspeed.zero.Init(config_dict_or_path=config):
                model = SequentialLinear(m["n_layers"], m["width"])
        else:  # the whole model on every rank, one layer after another: the one that no longer fits runs out
            model = SequentialLinear(m["n_layers"], m["width"], layer_by_layer=True)
        st.attach(model, stage="setup", strategy="deepspeed_stage_3", engine="zero3")
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
        engine, optimizer, _, _ = deepspeed.initialize(model=model, optimizer=optimizer, config=config)
        st.attach(engine, optimizer=optimizer)
        loader = regression_loader(
            ctx.config["max_steps"], ctx.config["batch_size"], m["width"], ctx.config.get("seed", 0)
        )
        train(
            ctx,
            batches_to(engine.device, loader),
            lambda b: nn.functional.mse_loss(engine(b[0]), b[1]),
            engine.backward,
            engine.step,
            lambda: st.attach(engine, optimizer=optimizer, stage="step"),
        )
