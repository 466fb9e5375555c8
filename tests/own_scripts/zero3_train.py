"""A user's own raw DeepSpeed ZeRO-3 script, as the deepspeed launcher starts it: nothing of shardtop in it.

The model is built before DeepSpeed sees it, outside ``deepspeed.zero.Init``,
so every rank holds it whole until ``deepspeed.initialize`` partitions it.

    DS_ACCELERATOR=cpu deepspeed --num_gpus 2 tests/own_scripts/zero3_train.py
"""

from __future__ import annotations

import argparse
import time

import deepspeed
import torch
from torch import nn


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--local_rank", type=int, default=0)  # the deepspeed launcher passes it
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--cuda", action="store_true", help="NCCL on one GPU per rank instead of gloo on CPU")
    args = parser.parse_args()
    device = torch.device("cuda", args.local_rank) if args.cuda else torch.device("cpu")
    if args.cuda:
        torch.cuda.set_device(device)
    deepspeed.init_distributed(dist_backend="nccl" if args.cuda else "gloo")
    config = {
        "train_micro_batch_size_per_gpu": 2,
        "zero_optimization": {"stage": 3},
        "zero_allow_untested_optimizer": True,
        "steps_per_print": 10**9,
    }
    torch.manual_seed(0)
    model = nn.Sequential(*(nn.Linear(args.width, args.width) for _ in range(4)), nn.Linear(args.width, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    engine, optimizer, _, _ = deepspeed.initialize(model=model, optimizer=optimizer, config=config)
    started = time.perf_counter()
    for _ in range(args.steps):
        x, y = torch.randn(2, args.width, device=device), torch.randn(2, 1, device=device)
        loss = nn.functional.mse_loss(engine(x), y)
        engine.backward(loss)
        engine.step()
    if args.cuda:
        torch.cuda.synchronize()
    print(f"loop seconds {time.perf_counter() - started:.4f}", flush=True)


if __name__ == "__main__":
    main()
