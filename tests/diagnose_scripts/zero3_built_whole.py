"""Story 2 on CPU: a ZeRO-3 model built whole, then handed to DeepSpeed, runs out of memory.

The model is built before DeepSpeed sees it (as in a LightningModule's
``__init__``), so every rank holds it whole.  ``deepspeed.initialize`` with
bf16 then converts it, whole, on every rank, in
``DeepSpeedEngine._configure_distributed_model``, before ZeRO-3 partitions
anything.  ``--device-memory`` caps what the process may allocate from then on
(its data segment), a stand-in for a small GPU; the conversion of the first
layer no longer fits.

    DS_ACCELERATOR=cpu torchrun --nproc-per-node 2 tests/diagnose_scripts/zero3_built_whole.py
"""

from __future__ import annotations

import argparse
import os
import resource

os.environ.setdefault("DS_ACCELERATOR", "cpu")

import deepspeed  # noqa: E402
import torch  # noqa: E402
from torch import nn  # noqa: E402

import shardtop.probe as st  # noqa: E402


def data_segment() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmData:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmData in /proc/self/status")


def cap_memory(headroom: int) -> None:
    _, hard = resource.getrlimit(resource.RLIMIT_DATA)
    resource.setrlimit(resource.RLIMIT_DATA, (data_segment() + headroom, hard))


class Stack(nn.Module):
    def __init__(self, depth: int, width: int) -> None:
        super().__init__()
        self.net = nn.Sequential(*(nn.Linear(width, width) for _ in range(depth)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--depth", type=int, default=4)
    parser.add_argument("--width", type=int, default=3072)
    parser.add_argument("--device-memory", type=int, default=8 << 20, help="bytes the process may still allocate")
    args = parser.parse_args()
    deepspeed.init_distributed(dist_backend="gloo", auto_mpi_discovery=False)
    config = {
        "train_micro_batch_size_per_gpu": 1,
        "bf16": {"enabled": True},
        "zero_optimization": {"stage": 3},
        "zero_allow_untested_optimizer": True,
        "steps_per_print": 10**9,
    }
    torch.manual_seed(0)
    with st.watch(name="zero3-built-whole") as probe:
        probe.extra_info["driver"] = "deepspeed.initialize"
        model = Stack(args.depth, args.width)  # built whole, outside deepspeed.zero.Init
        st.attach(model, stage="setup", strategy="deepspeed_stage_3", engine="zero3")
        optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
        cap_memory(args.device_memory)
        engine, *_ = deepspeed.initialize(model=model, optimizer=optimizer, config=config)
        st.attach(engine)


if __name__ == "__main__":
    main()
