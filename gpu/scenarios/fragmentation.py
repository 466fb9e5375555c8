"""A CUDA out-of-memory error caused by fragmentation, recorded by shardtop, on one GPU.

The caching allocator packs tensors of 1-10 MiB into 20 MiB segments.  This script trains a
small model under a per-process cap (``--cap-gib``), and in the forward of its first step fills
the cap (to within two segments) with tensors of 2-9 MiB, frees every other one, and then asks
for one tensor larger than any free block and than what is left under the cap (``--ask-mib``).
Half of the reserved memory is free by then, but in
pieces between live tensors: no segment can be returned, no block is large enough, and the
request fails.  ``shardtop report`` should explain it with ``allocator-fragmentation``
(an error: the request was smaller than the free memory the allocator held).

    SHARDTOP_RUNS_DIR=/tmp/runs python gpu/scenarios/fragmentation.py
    SHARDTOP_RUNS_DIR=/tmp/runs PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True python gpu/scenarios/fragmentation.py

With ``expandable_segments:True`` the allocator can grow a segment in place and reuse free
space at its end, but it cannot move live tensors: on an H200 (torch 2.11) this script ran out
of memory the same way with it on, and the rule's advice changes accordingly.
"""

from __future__ import annotations

import argparse
import os
import sys

import torch
from torch import nn

import shardtop.probe as st

MiB = 1 << 20
SIZES_MIB = (3, 5, 7, 9, 2, 4, 6, 8)
"""Between the allocator's 1 MiB small-pool limit and its 10 MiB own-segment size."""


SEGMENT = 20 * MiB
"""The segment the allocator cuts 1-10 MiB tensors from."""


def fill_and_free_every_other(cap: int, device: torch.device) -> list[torch.Tensor]:
    """Tensors until the reserved memory is within two segments of the cap, then every other one
    freed: what is left under the cap is smaller than the request that follows."""
    kept: list[torch.Tensor] = []
    i = 0
    while torch.cuda.memory_reserved(device) + 2 * SEGMENT < cap:
        kept.append(torch.empty(SIZES_MIB[i % len(SIZES_MIB)] * MiB, dtype=torch.uint8, device=device))
        i += 1
    return kept[1::2]  # the others are freed here, each between two live ones


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--cap-gib", type=float, default=8.0, help="the per-process cap on the GPU")
    parser.add_argument("--ask-mib", type=int, default=512, help="the one large request, after the fill")
    parser.add_argument("--steps", type=int, default=3)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("fragmentation.py needs a CUDA GPU (the allocator it fragments is CUDA's)", file=sys.stderr)
        sys.exit(2)
    device = torch.device("cuda", 0)
    torch.cuda.set_device(device)
    cap = int(args.cap_gib * (1 << 30))
    torch.cuda.set_per_process_memory_fraction(cap / torch.cuda.get_device_properties(device).total_memory, device)
    os.environ["SHARDTOP_MEM_LIMIT"] = str(cap)  # the probe records the cap with the OOM
    model = nn.Sequential(nn.Linear(1024, 4096), nn.ReLU(), nn.Linear(4096, 1024)).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    with st.watch(name="gpu-fragmentation"):
        st.attach(model, optimizer=optimizer, strategy="single GPU")
        held: list[torch.Tensor] = []
        for step in range(1, args.steps + 1):
            st.phase("forward", step)
            if step == 1:
                held = fill_and_free_every_other(cap, device)
                print(f"reserved {torch.cuda.memory_reserved(device) / MiB:.0f} MiB, "
                      f"allocated {torch.cuda.memory_allocated(device) / MiB:.0f} MiB; asking for {args.ask_mib} MiB")
                held.append(torch.empty(args.ask_mib * MiB, dtype=torch.uint8, device=device))
            loss = model(torch.randn(64, 1024, device=device)).square().mean()
            st.phase("backward")
            loss.backward()
            st.phase("optimizer")
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            st.step(step, loss=loss.item())
        del held


if __name__ == "__main__":
    main()
