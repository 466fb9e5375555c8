"""Ranks that touch CUDA before ``torch.cuda.set_device``: each keeps a context on GPU 0.

A plain DDP script (nothing of shardtop in it), started by torchrun on two GPUs:
every rank builds a tensor with ``.cuda()`` first — which means cuda:0 on every
rank — and only then sets its own device. NVML then lists rank 1's process on
GPU 0 as well as on GPU 1:

    shardtop run --headless -- torchrun --standalone --nproc_per_node 2 gpu/scenarios/wrong_gpu.py

``shardtop report`` should say ``cuda-context-on-wrong-gpu``; with ``--set-device-first``
the ranks set their device before anything else, and it should stay silent.
"""

from __future__ import annotations

import argparse
import os
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--set-device-first", action="store_true")
    parser.add_argument("--steps", type=int, default=40)
    args = parser.parse_args()
    local = int(os.environ["LOCAL_RANK"])
    if args.set_device_first:
        torch.cuda.set_device(local)
    scale = torch.ones(1).cuda()  # cuda:0 on every rank unless the device was set first
    torch.cuda.set_device(local)
    dist.init_process_group("nccl")
    model = nn.Sequential(nn.Linear(4096, 4096), nn.ReLU(), nn.Linear(4096, 4096)).cuda()
    ddp = DistributedDataParallel(model, device_ids=[local])
    opt = torch.optim.AdamW(ddp.parameters(), lr=1e-4)
    for _ in range(args.steps):
        x = torch.randn(64, 4096, device="cuda")
        loss = ddp(x).square().mean() * scale.to(x.device)
        loss.backward()
        opt.step()
        opt.zero_grad()
        time.sleep(0.1)  # long enough for the memory sampler to see the GPUs mid-training
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
