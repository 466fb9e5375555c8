"""Follow the ranks' and the supervisor's logs: new complete lines only, each with where it came from."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from shardtop.rundir.run_directory import RunDirectory

FIRST_READ_BYTES = 64 * 1024
"""On the first look at a log, only its end: a long run's log can be large."""
MAX_LINE = 2000
_RANK_LOG = re.compile(r"rank-(\d+)\.log$")


@dataclass(frozen=True, slots=True)
class LogLine:
    """One line of a log: ``source`` is ``runner``, ``r0``… or a host's command."""

    source: str
    text: str

    def __str__(self) -> str:
        return f"{self.source:>6} │ {self.text}"


@dataclass
class _Tail:
    offset: int
    pending: bytes = b""


@dataclass
class LogTail:
    """New lines of every log of a run, each prefixed with where it came from."""

    run: RunDirectory
    _tails: dict[Path, _Tail] = field(default_factory=dict)

    def sources(self) -> list[tuple[str, Path]]:
        out = [("runner", self.run.runner_log)]
        if self.run.logs_dir.is_dir():
            logs = [(int(m.group(1)), p) for p in self.run.logs_dir.iterdir() if (m := _RANK_LOG.search(p.name))]
            out.extend((f"r{rank}", p) for rank, p in sorted(logs))
            # `shardtop run`: each host's command, its ranks' output included
            out.extend((p.stem.removeprefix("command-"), p) for p in sorted(self.run.logs_dir.glob("command-*.log")))
        return out

    def read_new(self) -> list[str]:
        """The new lines as one text each: ``    r0 │ line``."""
        return [str(line) for line in self.read_new_lines()]

    def read_new_lines(self) -> list[LogLine]:
        return [LogLine(label, line) for label, path in self.sources() for line in self._read(path)]

    def _read(self, path: Path) -> list[str]:
        try:
            size = os.path.getsize(path)
        except OSError:
            return []
        tail = self._tails.get(path)
        skip_partial = False
        if tail is None:
            start = max(0, size - FIRST_READ_BYTES)
            tail = self._tails[path] = _Tail(start)
            skip_partial = start > 0
        if size < tail.offset:  # truncated or replaced: start over
            tail.offset, tail.pending = 0, b""
        if size == tail.offset:
            return []
        try:
            with open(path, "rb") as f:
                f.seek(tail.offset)
                chunk = f.read(size - tail.offset)
        except OSError:
            return []
        tail.offset += len(chunk)
        data = tail.pending + chunk
        *complete, tail.pending = data.split(b"\n")
        if skip_partial and complete:
            complete = complete[1:]
        return [_clean(line) for line in complete]


def _clean(raw: bytes) -> str:
    """One printable line: carriage-return progress bars keep their last state."""
    text = raw.decode("utf-8", "replace").rstrip("\r")
    if "\r" in text:
        text = text.rsplit("\r", 1)[-1]
    return text.expandtabs(4)[:MAX_LINE]
