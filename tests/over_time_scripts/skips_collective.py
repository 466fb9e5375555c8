"""A user's two-rank gloo loop in which one rank skips a collective that the other waits in
(nothing of shardtop in it).

    torchrun --nproc_per_node 2 tests/over_time_scripts/skips_collective.py [--long-step]

Each step takes about ``--step-s`` seconds and ends in an all-reduce of the gradients.  At step
``--at``, rank 1 leaves out the all-reduce (a branch only some ranks take) and goes on training alone,
while rank 0 waits in it for good.  ``--long-step`` instead makes step ``--at`` long for both ranks
(they compute, then meet in the all-reduce as usual): a slow step, not a hang.  ``--save-s S``: no rank
skips anything, and after the last step rank 0 spends S seconds as a save of a checkpoint does while
rank 1 ends; with ``--save-at K``, after step K instead, while rank 1 goes on into step K + 1 and waits
for it in that step's all-reduce.
"""

from __future__ import annotations

import argparse
import atexit
import os
import time

import torch
import torch.distributed as dist
from torch import nn


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--at", type=int, default=4)
    parser.add_argument("--step-s", type=float, default=0.4)
    parser.add_argument("--long-step", action="store_true")
    parser.add_argument("--save-s", type=float, default=0.0)
    parser.add_argument("--save-at", type=int, default=0)
    args = parser.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    model = nn.Linear(32, 32)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    for step in range(1, args.steps + 1):
        loss = model(torch.randn(8, 32)).pow(2).mean()
        loss.backward()
        time.sleep(args.step_s * (8 if args.long_step and step == args.at else 1))
        skip = not args.long_step and not args.save_s and rank == 1 and step >= args.at
        if not skip:
            for p in model.parameters():
                dist.all_reduce(p.grad)
        optimizer.step()
        optimizer.zero_grad()
        if rank == 0 and step == args.save_at:
            time.sleep(args.save_s)  # what a save of a checkpoint takes
    print(f"rank {rank} done", flush=True)
    if rank == 0 and not args.save_at:
        time.sleep(args.save_s)  # what a save of the model after training takes
    elif args.save_s:
        atexit._run_exitfuncs()  # ended as a process that returns does (what runs at exit has run), but
    os._exit(0)  # without gloo's teardown, which can abort a raw gloo run at exit


if __name__ == "__main__":
    main()
