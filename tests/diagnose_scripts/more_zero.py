"""DeepSpeed training scripts as people write them, one scenario each, for the rules that weigh
what ZeRO keeps whole on every rank.

Every scenario named on the command line runs in turn in the same processes and records into a
run directory of its own, named after it:

    DS_ACCELERATOR=cpu torchrun --nproc-per-node 2 tests/diagnose_scripts/more_zero.py zero3-small-layers

- ``zero3-small-layers``: a model of many small layers under ZeRO-3's default
  ``stage3_param_persistence_threshold`` (1e5 elements): every layer is kept whole on every rank.
- ``zero3-no-persistence``: the same model with the threshold at 0.
- ``zero2-frozen-backbone``: ZeRO-2 fine-tuning a small head on a large frozen backbone.
- ``zero2-full-finetune``: ZeRO-2 training every parameter with Adam.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from typing import Any

os.environ.setdefault("DS_ACCELERATOR", "cpu")

import deepspeed  # noqa: E402
import torch  # noqa: E402
from torch import nn  # noqa: E402

import shardtop.probe as st  # noqa: E402
from tests.diagnose_scripts.scenarios import record_each  # noqa: E402

SMALL_WIDTH = 256
SMALL_DEPTH = 64
"""64 layers of 256 x 256 (65 792 elements each): 16.1 MiB in fp32, each tensor under 1e5 elements."""
BACKBONE_WIDTH = 1024
BACKBONE_DEPTH = 6
"""6 layers of 1024 x 1024: 24.0 MiB in fp32."""


def small_layers() -> nn.Module:
    return nn.Sequential(*(nn.Linear(SMALL_WIDTH, SMALL_WIDTH) for _ in range(SMALL_DEPTH)))


class Finetune(nn.Module):
    """A backbone and a head; ``frozen`` freezes the backbone."""

    def __init__(self, frozen: bool) -> None:
        super().__init__()
        self.backbone = nn.Sequential(*(nn.Linear(BACKBONE_WIDTH, BACKBONE_WIDTH) for _ in range(BACKBONE_DEPTH)))
        self.head = nn.Linear(BACKBONE_WIDTH, 8)
        self.backbone.requires_grad_(not frozen)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.backbone(x))


def config(stage: int, **zero: Any) -> dict[str, Any]:
    return {
        "train_micro_batch_size_per_gpu": 4,
        "zero_optimization": {"stage": stage, **zero},
        "zero_allow_untested_optimizer": True,
        "steps_per_print": 10**9,
    }


def train(model: nn.Module, optimizer: torch.optim.Optimizer, cfg: dict[str, Any], width: int, steps: int = 2) -> None:
    st.attach(model, stage="setup", strategy=f"deepspeed_stage_{cfg['zero_optimization']['stage']}")
    engine, zero_optimizer, *_ = deepspeed.initialize(model=model, optimizer=optimizer, config=cfg)
    st.attach(engine, optimizer=zero_optimizer)
    generator = torch.Generator().manual_seed(engine.global_rank)
    for step in range(1, steps + 1):
        st.phase("forward", step)
        loss = engine(torch.randn(4, width, generator=generator)).square().mean()
        st.phase("backward")
        engine.backward(loss)
        st.phase("optimizer")
        engine.step()
        if step == 1:
            st.attach(engine, optimizer=zero_optimizer, stage="step")
        st.step(step, loss=loss.item())


def zero3_small_layers(threshold: int | None = None) -> None:
    zero = {} if threshold is None else {"stage3_param_persistence_threshold": threshold}
    cfg = config(3, **zero)
    with deepspeed.zero.Init(config_dict_or_path=cfg):  # partitioned as it is built
        model = small_layers()
    train(model, torch.optim.SGD(model.parameters(), lr=1e-3), cfg, SMALL_WIDTH)


def zero2_finetune(frozen: bool) -> None:
    model = Finetune(frozen)
    trainable = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.Adam(trainable, lr=1e-4)
    train(model, optimizer, config(2), BACKBONE_WIDTH)


SCENARIOS: dict[str, Callable[[], None]] = {
    "zero3-small-layers": zero3_small_layers,
    "zero3-no-persistence": lambda: zero3_small_layers(threshold=0),
    "zero2-frozen-backbone": lambda: zero2_finetune(frozen=True),
    "zero2-full-finetune": lambda: zero2_finetune(frozen=False),
}


def main(names: list[str]) -> None:
    deepspeed.init_distributed(dist_backend="gloo", auto_mpi_discovery=False)
    record_each(names, SCENARIOS, driver="deepspeed.initialize")


if __name__ == "__main__":
    main(sys.argv[1:])
