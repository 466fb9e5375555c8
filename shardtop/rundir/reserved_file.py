"""An append-only file that keeps room on the disk for its last lines.

A rank's event file must still receive the record of how the rank ended
(its OOM, its exit) when the disk has filled up meanwhile.  So the file
keeps ``RESERVE_BYTES`` allocated past its end with
``fallocate(FALLOC_FL_KEEP_SIZE)``: the blocks are the file's, but its size
does not change, so readers see nothing of them, and there is no spare file
to leave behind (``close`` gives the blocks back; after ``kill -9`` they stay
with the file, unseen, until it is removed).  Appends use those
blocks first; the reserve is renewed whenever less than half of it is left.
When it can no longer be renewed the disk is full, and what remains (at
least half the reserve) is kept for the last lines.

Nothing here raises: an append that fails returns the error, and a line cut
short by a full disk is cut off again (``ftruncate``), so the file never
holds a torn line.  Filesystems without ``fallocate`` (some network
filesystems) get no reserve; a full disk is then noticed at the first
failed append.

No torch and no textual: the probe uses it, and a TUI imports this module
only through ``shardtop.rundir.events``.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Callable
from pathlib import Path

RESERVE_BYTES = 64 * 1024
"""Room kept for the last lines: an OOM record with its 40-frame traceback is under 16 KiB."""
FALLOC_FL_KEEP_SIZE = 1
DISK_FULL = frozenset({errno.ENOSPC, errno.EDQUOT})

_fallocate: Callable[[int, int, int, int], int] | None = None
_fallocate_looked_up = False


def _libc_fallocate() -> Callable[[int, int, int, int], int] | None:
    """libc's ``fallocate`` (looked up once), or None where there is none."""
    global _fallocate, _fallocate_looked_up
    if not _fallocate_looked_up:
        _fallocate_looked_up = True
        try:
            import ctypes

            function = ctypes.CDLL(None, use_errno=True).fallocate
            function.argtypes = (ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64)
            function.restype = ctypes.c_int
            _fallocate = function
        except (OSError, AttributeError, ImportError):
            _fallocate = None
    return _fallocate


def reserve_past_end(fd: int, offset: int, length: int) -> None:
    """Allocate ``length`` bytes of ``fd`` from ``offset`` without changing its size; raises OSError."""
    function = _libc_fallocate()
    if function is None:
        raise OSError(errno.EOPNOTSUPP, "fallocate is not available here")
    if function(fd, FALLOC_FL_KEEP_SIZE, offset, length) != 0:
        code = _errno()
        raise OSError(code, os.strerror(code))


def _errno() -> int:
    import ctypes

    return ctypes.get_errno()


class ReservedAppendFile:
    """Appends whole lines to one file, keeping room for the last ones (see the module docstring).

    Not thread-safe: the caller holds a lock.
    """

    def __init__(self, path: Path, reserve: int = RESERVE_BYTES) -> None:
        self.path = path
        self.reserve = reserve
        self.full: OSError | None = None
        """Set once the disk is full: from then on only ``last=True`` lines should be appended."""
        self.broken: OSError | None = None
        """Set when the file cannot be opened or written at all."""
        self._fd = -1
        self._size = 0
        self._reserved_to = 0
        self._can_reserve = True
        try:
            path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
            self._size = os.fstat(self._fd).st_size
        except OSError as e:
            self.broken = e
            return
        self._keep_reserve()

    @property
    def open(self) -> bool:
        return self._fd >= 0

    @property
    def reserved(self) -> int:
        """Bytes allocated past the end of the file now."""
        return max(0, self._reserved_to - self._size)

    def append(self, data: bytes, *, sync: bool = False) -> OSError | None:
        """Write ``data`` whole or not at all; the error if it was not written."""
        if self._fd < 0:
            return self.broken or OSError(errno.EBADF, "the file is closed")
        start = self._size
        view = memoryview(data)
        try:
            while view:
                written = os.write(self._fd, view)
                if written <= 0:
                    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
                view = view[written:]
                self._size += written
            if sync:
                os.fsync(self._fd)
        except OSError as e:
            self._cut_back(start)
            if e.errno in DISK_FULL:
                self.full = self.full or e
            else:
                self.broken = self.broken or e
            return e
        self._keep_reserve()
        return None

    def _cut_back(self, size: int) -> None:
        """Remove the part of a line a failed write left, so no torn line stays."""
        if self._size == size:
            return
        try:
            os.ftruncate(self._fd, size)
            self._size = size
        except OSError:
            pass

    def _keep_reserve(self) -> None:
        """Renew the reserve once less than half is left; a disk too full to renew it is full."""
        if self.full is not None or not self._can_reserve or self.reserved >= self.reserve // 2:
            return
        try:
            reserve_past_end(self._fd, self._size, self.reserve)
        except OSError as e:
            if e.errno in DISK_FULL:
                self.full = e
            else:  # not supported by this filesystem: live without a reserve
                self._can_reserve = False
            return
        self._reserved_to = self._size + self.reserve

    def close(self) -> None:
        """Give the reserve back to the disk (a truncation to the file's own size) and close."""
        if self._fd < 0:
            return
        try:
            os.ftruncate(self._fd, os.fstat(self._fd).st_size)
        except OSError:
            pass
        try:
            os.close(self._fd)
        except OSError:
            pass
        self._fd = -1
