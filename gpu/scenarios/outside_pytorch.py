"""Device memory allocated outside PyTorch's caching allocator, recorded by shardtop, on one GPU.

A library that calls the CUDA driver itself (a custom extension, another framework in the same
process) holds memory the allocator never sees.  This script takes ``--outside-gib`` of the GPU
with ``cuMemAlloc`` from the driver (``libcuda.so.1``, present wherever the NVIDIA driver is),
then trains a small model with shardtop's probe, so that NVML's reading of the GPU and the
allocator's reserved bytes are sampled together.  ``shardtop report`` should say
``memory-outside-pytorch`` (a warning).

    SHARDTOP_RUNS_DIR=/tmp/runs python gpu/scenarios/outside_pytorch.py --outside-gib 6

With ``--ask-gib``, the second step's forward asks PyTorch for that much at once: with most of
the GPU taken outside (``--outside-gib 128 --ask-gib 16`` on a 141 GiB H200) the request fails,
and the finding is the error that explains the OOM.
"""

from __future__ import annotations

import argparse
import ctypes
import sys
import time

import torch
from torch import nn

import shardtop.probe as st

GiB = 1 << 30


def allocate_outside(nbytes: int) -> int:
    """``nbytes`` of device memory from the CUDA driver on the current context; the pointer."""
    libcuda = ctypes.CDLL("libcuda.so.1")
    pointer = ctypes.c_uint64()
    result = libcuda.cuMemAlloc_v2(ctypes.byref(pointer), ctypes.c_size_t(nbytes))
    if result != 0:
        raise RuntimeError(f"cuMemAlloc_v2 of {nbytes} bytes failed with CUresult {result}")
    return pointer.value


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--outside-gib", type=float, default=6.0, help="device memory taken outside PyTorch")
    parser.add_argument("--ask-gib", type=float, default=0.0, help="one PyTorch request in step 2 (0: none)")
    parser.add_argument("--steps", type=int, default=4)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("outside_pytorch.py needs a CUDA GPU and its driver", file=sys.stderr)
        sys.exit(2)
    device = torch.device("cuda", 0)
    torch.cuda.set_device(device)
    torch.zeros(1, device=device)  # makes the primary context current on this thread
    allocate_outside(int(args.outside_gib * GiB))
    model = nn.Sequential(nn.Linear(1024, 4096), nn.ReLU(), nn.Linear(4096, 1024)).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    with st.watch(name="gpu-outside-pytorch"):
        st.attach(model, optimizer=optimizer, strategy="single GPU")
        for step in range(1, args.steps + 1):
            st.phase("forward", step)
            if step == 2 and args.ask_gib:
                big = torch.empty(int(args.ask_gib * GiB), dtype=torch.uint8, device=device)
                del big
            loss = model(torch.randn(64, 1024, device=device)).square().mean()
            st.phase("backward")
            loss.backward()
            st.phase("optimizer")
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            time.sleep(1.0)  # the probe's sampler reads NVML twice a second: let it, while training
            st.step(step, loss=loss.item())
    # the driver frees the memory with the context at exit


if __name__ == "__main__":
    main()
