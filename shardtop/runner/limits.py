"""``gpu_mem_limit``: make a 141 GB H200 behave like the question's 15 GB card.

On CUDA the cap is ``torch.cuda.set_per_process_memory_fraction``.  On CPU the
same key caps the memory the rank allocates from here on (its data segment,
``RLIMIT_DATA``), so CPU runs can run out of memory for real too.
"""

from __future__ import annotations

import os
import resource
from typing import TYPE_CHECKING

MEM_LIMIT_ENV = "SHARDTOP_MEM_LIMIT"
"""Tells the probe which cap the rank runs under."""

if TYPE_CHECKING:
    from shardtop.runner.rank import RankContext


def data_segment_bytes() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmData:"):
                return int(line.split()[1]) * 1024
    return 0


def apply_memory_limit(ctx: RankContext) -> int | None:
    limit = ctx.config.get("gpu_mem_limit")
    if not limit:
        return None
    if ctx.accelerator == "cuda":
        import torch

        index = ctx.local_rank
        torch.cuda.set_device(index)
        total = torch.cuda.get_device_properties(index).total_memory
        torch.cuda.set_per_process_memory_fraction(min(1.0, limit / total), index)
        print(f"gpu_mem_limit: {limit} bytes of {total} on cuda:{index}", flush=True)
    else:
        _, hard = resource.getrlimit(resource.RLIMIT_DATA)
        cap = data_segment_bytes() + int(limit)
        if hard != resource.RLIM_INFINITY:
            cap = min(cap, hard)
        resource.setrlimit(resource.RLIMIT_DATA, (cap, hard))
        print(f"gpu_mem_limit on CPU: at most {limit} more bytes of data segment", flush=True)
    os.environ[MEM_LIMIT_ENV] = str(int(limit))
    return int(limit)
