"""A rank under a memory cap: room kept for its OOM record, and OOMs that do not say so.

On CPU a rank runs out of memory when its address space is capped
(``RLIMIT_DATA``, which ``gpu_mem_limit`` sets on CPU) or the kernel refuses
to commit more.  Then Python itself can no longer allocate:

* recording the OOM (walking the failing stack, encoding the event) would
  fail in turn.  So the probe maps ``RESERVE_BYTES`` of private memory when it
  is imported (a preset's rank imports it before its cap applies, so the
  reserve does not come out of the run's allowance) and unmaps it just
  before it attributes an OOM.  The pages are never touched: they cost
  address space and commit charge, which is what such a cap counts, and no
  physical memory.
* the error is not always a ``MemoryError``: an import that runs out can end
  in ``SystemError: error return without exception set``, a thread refused
  its stack in ``can't start new thread``.  ``starved_of_memory`` tells such
  an error by where it struck: at the cap.
"""

from __future__ import annotations

import mmap
import re
import resource

RESERVE_BYTES = 16 << 20
"""Attributing a forward OOM allocated 10 KiB with the module names learnt at set-up, and, when
they had to be looked up at the OOM, 1.7 MiB for 18 000 modules and 14 MiB for 100 000
(tracemalloc peaks, CPU).  A backward OOM's graph walk was not measured."""


class MemoryReserve:
    """A private anonymous mapping that can be given back once."""

    def __init__(self, size: int = RESERVE_BYTES) -> None:
        self.size = size
        self._map: mmap.mmap | None
        try:
            self._map = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE)
        except (OSError, ValueError, MemoryError):
            self._map = None

    @property
    def held(self) -> bool:
        return self._map is not None

    def release(self) -> bool:
        """Give the memory back; True if there was any to give."""
        mapping, self._map = self._map, None
        if mapping is None:
            return False
        mapping.close()
        return True


OOM_RESERVE = MemoryReserve()
"""This process's reserve, released by the first OOM the probe records."""


# -- errors that are OOMs by where they struck ----------------------------------------------

STARVED_BYTES = 1 << 20
"""Headroom under a data-segment cap below which Python's own small allocations fail."""
_THREAD_REFUSED = re.compile(r"can't start new thread|Resource temporarily unavailable", re.IGNORECASE)


def starved_of_memory(exc: BaseException) -> bool:
    """Is ``exc`` an OOM by where it struck, though it does not say so?

    Under a data-segment cap Python's small allocations fail as other errors
    too (``data_segment_exhausted``), and a thread refused its stack fails
    as ``can't start new thread`` (Python) or ``Resource temporarily
    unavailable`` (C++): that is an OOM when less than a thread's stack was
    left under the cap.
    """
    chain = [exc, *(e for e in (exc.__cause__, exc.__context__) if e is not None)]
    refused = any(_THREAD_REFUSED.search(_first_line_or_empty(e)) for e in chain)
    return data_segment_exhausted(STARVED_BYTES + (thread_stack_bytes() if refused else 0))


def _first_line_or_empty(exc: BaseException) -> str:
    try:
        return str(exc).split("\n", 1)[0]
    except Exception:  # noqa: BLE001
        return ""


def thread_stack_bytes() -> int:
    """The stack a new thread asks for: ``RLIMIT_STACK`` (glibc), 32 MiB when that is unlimited."""
    soft, _ = resource.getrlimit(resource.RLIMIT_STACK)
    return 32 << 20 if soft == resource.RLIM_INFINITY else int(soft)


def data_segment_exhausted(margin: int = STARVED_BYTES) -> bool:
    """Is this process within ``margin`` bytes of its ``RLIMIT_DATA`` cap (``gpu_mem_limit`` on CPU)?

    There, Python's own small allocations fail, and not always as a
    ``MemoryError``: an import that runs out can end in ``SystemError: error
    return without exception set``.  Measured on such failures: 0 to 0.1 MiB
    left.  A ``MemoryError`` while looking is an answer too.
    """
    try:
        soft, _ = resource.getrlimit(resource.RLIMIT_DATA)
        if soft == resource.RLIM_INFINITY:
            return False
        with open("/proc/self/status", "rb") as status:
            for line in status:
                if line.startswith(b"VmData:"):
                    return soft - int(line.split()[1]) * 1024 < margin
    except MemoryError:
        return True
    except (OSError, ValueError):
        return False
    return False
