"""Bytes the process's C allocator has handed out and not taken back: CPU memory as an allocator sees it.

A CPU rank has no allocator to ask as a GPU rank does; its resident set (RSS)
moves in steps of the heap's growth, and holes left by freed activations keep
it high.  glibc's ``mallinfo2`` counts what is in use (``uordblks``, in every
arena) plus what is mapped for large blocks (``hblkhd``), so a tensor kept
across steps shows up as exactly its size.  It walks every arena's free
lists: under a microsecond on a fresh heap, 0.1 to 0.75 ms on a fragmented
one with several threads' arenas, so the probe reads it once a step
(``MemorySampler.heap_now``).  None where the C library has no ``mallinfo2``
(glibc before 2.33, musl, macOS).
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable

_FIELDS = ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")


class _MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in _FIELDS]


def _reader() -> Callable[[], int] | None:
    try:
        mallinfo2 = ctypes.CDLL(None).mallinfo2
    except (OSError, AttributeError):
        return None
    mallinfo2.restype = _MallInfo2
    mallinfo2.argtypes = []

    def in_use() -> int:
        info = mallinfo2()
        return int(info.uordblks + info.hblkhd)

    return in_use


heap_in_use: Callable[[], int] | None = _reader()
"""The C allocator's bytes in use, or None where it cannot be read."""
