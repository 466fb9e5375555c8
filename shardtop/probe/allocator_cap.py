"""A CPU rank's allocator cap (``gpu_mem_limit`` on CPU, ``runner/cpu_cap.c``), as the probe reads it.

Where a preset's CPU rank has the cap library preloaded and armed, what its C allocator handed out since
the cap was armed is the rank's allocated memory, as a GPU allocator's would be: its samples and its OOM
record carry it, beside the cap.  Attributing an OOM needs a little room under the cap: the probe widens it
by ``cap.RESERVE_BYTES`` once, as it gives back its reserve under a data segment limit.
"""

from __future__ import annotations

import ctypes
import os
from functools import cache

LIBRARY_ENV = "SHARDTOP_CPU_CAP_LIBRARY"
"""Set in a rank's environment where the library is preloaded (its path)."""


class AllocatorCap:
    """The preloaded library's counters and cap in this process."""

    def __init__(self, process: ctypes.CDLL) -> None:
        process.shardtop_cap_arm.argtypes = [ctypes.c_longlong]
        process.shardtop_cap_widen.argtypes = [ctypes.c_longlong]
        for name in ("shardtop_cap_held", "shardtop_cap_peak", "shardtop_cap_limit"):
            getattr(process, name).restype = ctypes.c_longlong
        self._process = process

    def arm(self, limit: int) -> None:
        """Cap what is handed out from now on at ``limit`` bytes."""
        self._process.shardtop_cap_arm(limit)

    def widen(self, extra: int) -> None:
        self._process.shardtop_cap_widen(extra)

    @property
    def armed(self) -> bool:
        return int(self._process.shardtop_cap_limit()) >= 0

    def held(self) -> int:
        """Bytes handed out since the cap was armed and not given back."""
        return int(self._process.shardtop_cap_held())

    def peak(self) -> int:
        return int(self._process.shardtop_cap_peak())


@cache
def allocator_cap() -> AllocatorCap | None:
    """This process's allocator cap, where the library is preloaded (armed or not yet); else None."""
    if not os.environ.get(LIBRARY_ENV):
        return None
    try:
        process = ctypes.CDLL(None)
    except OSError:
        return None
    return AllocatorCap(process) if hasattr(process, "shardtop_cap_arm") else None


def armed_cap() -> AllocatorCap | None:
    """The allocator cap where it is armed in this process."""
    cap = allocator_cap()
    return cap if cap is not None and cap.armed else None
