"""A run's event files: each rank appends its own (``EventWriter``), readers follow them all
(``EventReader``) or read them at once (``read_all``).

Writing never takes training down: a full disk stops the ordinary events, once, with a ``Fault`` of
part ``events``, and the last records (``Oom``, ``Fault``, ``Exit``) still go into room kept for them.
Reading skips (and counts) what it cannot parse: a torn last line never crashes a reader.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import msgspec

from shardtop.rundir.cluster import host_name
from shardtop.rundir.event_lines import decode, encode
from shardtop.rundir.events import EVENT_FILE_PREFIX, EVENT_FILE_SUFFIX, LAST_RECORDS, AnyEvent, Event
from shardtop.rundir.reserved_file import ReservedAppendFile


def event_file(events_dir: Path, rank: int) -> Path:
    return events_dir / f"{EVENT_FILE_PREFIX}{rank}{EVENT_FILE_SUFFIX}"


class EventWriter:
    """Appends one rank's events to its file: flushed per event, fsynced for the last records.

    Thread-safe (the memory sampler writes from its own thread), and it never
    raises: a rank must not die because its record cannot be written.  When
    the disk fills up (or the file cannot be written at all) ordinary events
    stop, ``stopped`` says why, ``on_stop`` is told once, and the last records
    (``LAST_RECORDS``) are still written into the room ``ReservedAppendFile``
    keeps for them.  ``path=None`` writes nowhere (the run directory could
    not be made).
    """

    def __init__(
        self,
        path: Path | None,
        rank: int,
        host: str | None = None,
        on_stop: Callable[[str], None] | None = None,
    ) -> None:
        self.path = path
        self.rank = rank
        self.host = host or host_name()
        self.on_stop = on_stop
        self.stopped: str | None = None
        """Why ordinary events are no longer written (``No space left on device``); None while they are."""
        self._lock = threading.RLock()  # a signal handler may write the exit while the same thread writes
        self._file = ReservedAppendFile(path) if path is not None else None
        if self._file is None:
            self.stopped = "no run directory to write to"
        elif self._file.broken is not None:
            self.stopped = f"cannot open {path}: {_reason(self._file.broken)}"
        elif self._file.full is not None:
            self.stopped = _reason(self._file.full)

    def write(self, event: Event) -> bool:
        """Append ``event`` stamped with this rank, host and the time now; False if it was not written.

        Events are frozen: the stamped copy is what is written, ``event`` itself is left as it was.
        """
        last = isinstance(event, LAST_RECORDS)
        try:
            line = encode(msgspec.structs.replace(event, rank=self.rank, host=self.host, t=time.time()))
        except Exception:  # noqa: BLE001 - an event that cannot be encoded (or no memory left) is dropped
            return False
        with self._lock:
            if self._file is None or not self._file.open or (self.stopped is not None and not last):
                return False
            error = self._file.append(line, sync=last)
            newly_stopped = self._note_stop() if self.stopped is None else None
        if newly_stopped is not None and self.on_stop is not None:
            self.on_stop(newly_stopped)
        return error is None

    def _note_stop(self) -> str | None:
        file = self._file
        if file is None:
            return None
        problem = file.broken or file.full
        if problem is not None:
            self.stopped = _reason(problem)
        return self.stopped

    def close(self) -> None:
        with self._lock:
            if self._file is not None:
                self._file.close()


def _reason(error: OSError) -> str:
    return error.strerror or str(error)


@dataclass
class _Tail:
    offset: int = 0
    pending: bytes = b""
    size: int = 0
    """The file's size when it was last opened."""


@dataclass
class EventReader:
    """Follows every rank's event file in a directory, returning only new events.

    A line without its newline yet is held back until it is complete; call
    ``finish()`` once the writers are gone to count such a torn last line.
    """

    events_dir: Path
    skipped: dict[str, int] = field(default_factory=lambda: {"bad": 0, "unknown": 0, "newer": 0, "torn": 0})
    _tails: dict[str, _Tail] = field(default_factory=dict)
    _listed: tuple[list[str], list[str]] = field(default_factory=lambda: ([], []))

    def files(self) -> list[Path]:
        return [Path(p) for p in self._paths()]

    @property
    def file_count(self) -> int:
        """Event files seen at the last read."""
        return len(self._listed[1])

    def _paths(self) -> list[str]:
        """The event files in name order, as strings: a follower lists 512 of them several times a second."""
        try:
            names = os.listdir(self.events_dir)
        except OSError:
            return []
        if names != self._listed[0]:
            directory = os.fspath(self.events_dir)
            paths = sorted(
                os.path.join(directory, n)
                for n in names
                if n.startswith(EVENT_FILE_PREFIX) and n.endswith(EVENT_FILE_SUFFIX)
            )
            self._listed = (names, paths)
        return self._listed[1]

    def read_new(self, limit: int | None = None) -> list[AnyEvent]:
        """Every event appended since the last call, file by file; at most ``limit`` bytes of each file.

        Each file is opened anew every time: on shared storage (NFS) opening is
        what fetches what other hosts appended (close-to-open consistency); a
        file kept open, or a size from ``stat``, can lag by seconds.  What a
        ``limit`` leaves unread (``unread_bytes``) is read by the next call.
        """
        events: list[AnyEvent] = []
        for path in self._paths():
            events.extend(self._read_file(path, limit))
        return events

    @property
    def unread_bytes(self) -> int:
        """Bytes the files held at the last read beyond what was read (a ``limit`` left them)."""
        return sum(max(0, t.size - t.offset) for t in self._tails.values())

    def _read_file(self, path: str, limit: int | None = None) -> Iterator[AnyEvent]:
        tail = self._tails.setdefault(path, _Tail())
        try:
            with open(path, "rb", buffering=0) as f:
                size = tail.size = os.fstat(f.fileno()).st_size
                if size < tail.offset:  # a writer cut a torn line off: read again from that line's start
                    tail.offset = min(size, tail.offset - len(tail.pending))
                    tail.pending = b""
                f.seek(tail.offset)
                chunk = f.read() if limit is None else f.read(limit)
        except OSError:
            return
        if not chunk:
            return
        tail.offset += len(chunk)
        data = tail.pending + chunk
        *lines, tail.pending = data.split(b"\n")
        for line in lines:
            if not line.strip():
                continue
            result = decode(line)
            if isinstance(result, str):
                self.skipped[result] += 1
            else:
                yield result

    def finish(self) -> None:
        """Count lines left without a newline (a writer died mid-line) as torn."""
        for tail in self._tails.values():
            if tail.pending.strip():
                self.skipped["torn"] += 1
                tail.pending = b""

    @property
    def skipped_total(self) -> int:
        return sum(self.skipped.values())


def read_all(events_dir: Path) -> tuple[list[AnyEvent], dict[str, int]]:
    """Every event of a finished (or live) run at once, with the skip counts."""
    reader = EventReader(events_dir)
    events = reader.read_new()
    reader.finish()
    return events, dict(reader.skipped)
