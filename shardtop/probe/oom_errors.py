"""Which errors are out-of-memory errors, and what their messages say.

An OOM is a ``MemoryError``, an ``OSError`` with ``ENOMEM``, torch's
``OutOfMemoryError``, or a ``RuntimeError`` whose first line says so (``out of
memory``, the CPU allocator's or cuBLAS/cuDNN's allocation failure); an error
caused by one, down its ``__cause__``/``__context__`` chain, counts too.  The
message gives the bytes that were asked for.  Torch is looked up among the
loaded modules, never imported, so this works before the training script
imports it.
"""

from __future__ import annotations

import errno
import re
import sys

_CPU_ALLOC = re.compile(r"you tried to allocate (\d+) bytes", re.IGNORECASE)
_SIZED_ALLOC = re.compile(r"tried to allocate ([\d.]+)\s*(bytes|B|KiB|MiB|GiB|TiB)\b", re.IGNORECASE)
_UNITS = {"bytes": 1, "b": 1, "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "tib": 1 << 40}
_OOM_MESSAGES = re.compile(
    r"DefaultCPUAllocator: can't allocate memory|out of memory|"
    r"CUBLAS_STATUS_ALLOC_FAILED|CUDNN_STATUS_ALLOC_FAILED|cudaErrorMemoryAllocation",
    re.IGNORECASE,
)


def _is_oom_itself(exc: BaseException) -> bool:
    if isinstance(exc, MemoryError) or (isinstance(exc, OSError) and exc.errno == errno.ENOMEM):
        return True
    torch = sys.modules.get("torch")
    oom_type = getattr(torch, "OutOfMemoryError", None)
    if oom_type is not None and isinstance(exc, oom_type):
        return True
    return isinstance(exc, RuntimeError) and bool(_OOM_MESSAGES.search(str(exc).split("\n", 1)[0]))


def oom_path(exc: BaseException) -> list[BaseException] | None:
    """``exc`` and the errors down its ``__cause__``/``__context__`` chain to the OOM; None if none."""
    seen: set[int] = set()
    stack: list[list[BaseException]] = [[exc]]
    while stack:
        path = stack.pop()
        current = path[-1]
        if id(current) in seen or len(path) > 32:
            continue
        seen.add(id(current))
        if _is_oom_itself(current):
            return path
        stack.extend([*path, nxt] for nxt in (current.__context__, current.__cause__) if nxt is not None)
    return None


def is_out_of_memory(exc: BaseException) -> bool:
    """A CUDA or CPU allocation failure, or an error caused by one."""
    return oom_path(exc) is not None


def parse_requested_bytes(message: str) -> int | None:
    """Bytes an OOM message says were asked for (CPU: exact; CUDA: to its 3 printed digits)."""
    match = _CPU_ALLOC.search(message)
    if match:
        return int(match.group(1))
    match = _SIZED_ALLOC.search(message)
    return int(float(match.group(1)) * _UNITS[match.group(2).lower()]) if match else None


def first_line(message: str, limit: int = 500) -> str:
    line = message.strip().split("\n", 1)[0].strip()
    return line if len(line) <= limit else line[: limit - 1] + "…"
