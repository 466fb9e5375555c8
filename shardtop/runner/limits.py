"""``gpu_mem_limit``: make a 141 GB H200 behave like the question's 15 GB card.

On CUDA the cap is ``torch.cuda.set_per_process_memory_fraction``.  On CPU the
same key caps what the rank's C allocator hands out from here on
(``cpu_cap.py``: the allocation past it is refused, and torch raises its CPU
out-of-memory error there), so CPU runs run out of memory for real too, in the
module that asked.  Where that allocator cap could not be preloaded (no C
compiler), the rank's data segment is capped instead (``RLIMIT_DATA``), which
also counts thread stacks and address space reserved but never touched.
"""

from __future__ import annotations

import os
import resource
from typing import TYPE_CHECKING

from shardtop.runner import cpu_cap

CAP_FALLBACK_ENV = "SHARDTOP_CPU_CAP_FALLBACK"
"""Set by the supervisor: why the allocator cap is not preloaded ("" where it is)."""
MEM_LIMIT_ENV = "SHARDTOP_MEM_LIMIT"
"""Tells the probe which cap the rank runs under."""
RLIMIT_MAX = 2**63 - 1
"""The largest limit ``setrlimit`` takes (a C long long)."""

if TYPE_CHECKING:
    from shardtop.runner.context import RankContext


def data_segment_bytes() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmData:"):
                return int(line.split()[1]) * 1024
    return 0


def apply_memory_limit(ctx: RankContext) -> int | None:
    """Cap this rank's memory at ``gpu_mem_limit``; the cap in bytes, or None if none applies.

    A limit at or above the GPU's whole memory caps nothing (a fraction above
    1 is an error in torch): the rank runs uncapped and says so in its log.
    """
    limit = ctx.gpu_mem_limit
    if limit is None:
        return None
    if ctx.accelerator == "cuda":
        import torch

        index = ctx.local_rank
        torch.cuda.set_device(index)
        total = torch.cuda.get_device_properties(index).total_memory
        if limit >= total:
            print(f"gpu_mem_limit: {limit} bytes is at least cuda:{index}'s {total}; nothing to cap", flush=True)
            return None
        torch.cuda.set_per_process_memory_fraction(limit / total, index)
        print(f"gpu_mem_limit: {limit} bytes of {total} on cuda:{index}", flush=True)
    elif cpu_cap.arm(limit):
        print(f"gpu_mem_limit on CPU: at most {limit} more bytes from the C allocator", flush=True)
    else:
        _, hard = resource.getrlimit(resource.RLIMIT_DATA)
        cap = min(data_segment_bytes() + limit, RLIMIT_MAX)
        if hard != resource.RLIM_INFINITY:
            cap = min(cap, hard)
        resource.setrlimit(resource.RLIMIT_DATA, (cap, hard))
        why = os.environ.get(CAP_FALLBACK_ENV) or "the allocator cap is not loaded in this process"
        print(f"gpu_mem_limit on CPU: at most {limit} more bytes of data segment ({why})", flush=True)
    os.environ[MEM_LIMIT_ENV] = str(limit)
    return limit
