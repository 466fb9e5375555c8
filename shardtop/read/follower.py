"""Follow one run directory as it grows: the one loop from event files to the read model.

``RunFollower.poll()`` folds the events appended since the last call, reads
the run's status, parses ``run.json`` again only when the file changed, and
returns a new ``RunModel`` when any of the three changed (None otherwise).
The TUI's run feed, the home view's run list and ``--headless`` each hold one
per run they watch; how often they poll and what they do with the model is
theirs.  No torch, no textual.

``read_first()`` reads only the head of each rank's event file, where a rank
writes its hello, the tree and its shards: enough for ``attach`` to draw a
run's first frame at once; the next poll reads on from there.
"""

from __future__ import annotations

import os

from shardtop.collector import collector_paused
from shardtop.read.run_fold import RunStateBuilder
from shardtop.read.run_model import RunModel
from shardtop.read.run_state import RunState
from shardtop.rundir.event_files import EventReader
from shardtop.rundir.run_directory import RunDirectory
from shardtop.rundir.run_meta import RunMeta
from shardtop.rundir.run_status import RunStatus

FIRST_BYTES = 8 << 20
"""Bytes of each event file ``read_first`` reads: a 100 000-module tree and its shards take 2.8 MB."""

FileStamp = tuple[int, int, int]
"""A file's inode, size and modification time: ``run.json`` is replaced whole (a rename), so any
write changes one of them."""


def fold_new(reader: EventReader, builder: RunStateBuilder, limit: int | None = None) -> int:
    """Fold the events appended since the last call (at most ``limit`` bytes of each file); how many there were.

    The cyclic garbage collector is paused meanwhile: opening a run of 512 ranks
    decodes tens of thousands of events, and the collections their allocations
    trigger (each scanning everything alive, a whole app included) cost more
    than the decoding.  Events hold no cycles; nothing waits for the collector.
    """
    with collector_paused():
        events = reader.read_new(limit)
        count = len(events)
        builder.apply(events)
        del events  # gone before the collector runs again: it then scans only what the fold kept
    builder.note_skipped(reader.skipped)
    return count


def file_stamp(path: os.PathLike[str]) -> FileStamp | None:
    """None where the file cannot be looked at (not written yet, or gone)."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_ino, st.st_size, st.st_mtime_ns)


class RunFollower:
    """One run's events, ``run.json`` and status, read incrementally into a ``RunModel``."""

    def __init__(self, run: RunDirectory) -> None:
        self.run = run
        self.reader = EventReader(run.events_dir)
        self.builder = RunStateBuilder()
        self.status: RunStatus | None = None
        """The status as last read (``read_status``, or handed to ``poll``); None before the first read."""
        self._meta = RunMeta()
        self._meta_stamp: FileStamp | None = None
        self._meta_read = False
        self._model: RunModel | None = None
        self._polled: RunModel | None = None

    @property
    def structure(self) -> int:
        """Counts what a view must show at once (``RunStateBuilder.structure``)."""
        return self.builder.structure

    @property
    def file_count(self) -> int:
        """Event files seen at the last read."""
        return self.reader.file_count

    @property
    def unread_bytes(self) -> int:
        """What ``read_first`` left of the event files for the next read."""
        return self.reader.unread_bytes

    @property
    def state(self) -> RunState:
        return self.builder.snapshot()

    @property
    def meta(self) -> RunMeta:
        """``run.json`` read, again only when the file changed since the last read."""
        stamp = file_stamp(self.run.meta_path)
        if not self._meta_read or stamp != self._meta_stamp:
            parsed = self.run.read_meta()
            if parsed != self._meta:  # rewritten alike (a pid added and removed): the same model stands
                self._meta = parsed
            self._meta_stamp, self._meta_read = stamp, True
        return self._meta

    def read_events(self) -> int:
        """Fold what was appended since the last read; how many events that was."""
        return fold_new(self.reader, self.builder)

    def read_first(self, limit: int = FIRST_BYTES) -> RunModel:
        """The run from the first ``limit`` bytes of each event file, and its status: a first frame's model."""
        fold_new(self.reader, self.builder, limit)
        self.read_status()
        return self.model()

    def read_status(self) -> bool:
        """Read the run's status from its directory; whether it changed."""
        status = self.run.status()
        changed = status != self.status
        self.status = status
        return changed

    def model(self) -> RunModel:
        """The run as folded so far: the same object while events, ``run.json`` and status stay as they were."""
        state, meta, status = self.state, self.meta, self.status
        m = self._model
        if m is None or m.state is not state or m.meta is not meta or m.status != status:
            m = self._model = RunModel.of(state, meta, status)
        return m

    def poll(self, status: RunStatus | None = None) -> RunModel | None:
        """Read what is new; the model if it changed since the last poll, else None.

        ``status``: the run's status where the caller has just read it (the run
        list reads every run's to know which are live); else it is read here.
        """
        self.read_events()
        if status is None:
            self.read_status()
        else:
            self.status = status
        m = self.model()
        if m is self._polled:
            return None
        self._polled = m
        return m

    def finish(self) -> RunModel:
        """The run once its writers are gone: a line left without its newline counts as torn."""
        self.read_events()
        self.reader.finish()
        self.builder.note_skipped(self.reader.skipped)
        self.read_status()
        self._polled = self.model()
        return self._polled
