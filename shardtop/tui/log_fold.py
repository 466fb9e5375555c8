"""The run's log as the Log tab tells it: Python's warnings folded, one entry per warning with a count.

A rank that calls a deprecated function every step prints the same two lines
every step (``path:83: FutureWarning: message`` and the source line under it),
from every rank: forty of them hide the few lines that matter.  ``FoldedLog``
keeps one entry per distinct warning, where it first came, counting how often
and from which ranks it came since, and drops the source line that follows
each.  Every other line is kept as it came.  The entry says the warning's
message first and where it was raised last, shortened to the package's own
path, so that what a narrow pane cuts, if anything, is the least useful part.

Pure: no Textual.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field

from shardtop.tui.watch.log_tail import LogLine

MAX_ENTRIES = 5000
"""Entries kept; past this the oldest go."""
_WARNING = re.compile(r"^(?P<path>\S.*?):(?P<line>\d+): (?P<category>[A-Z]\w*Warning): (?P<message>.*)$")
_PACKAGES = re.compile(r"^.*?[/\\](?:site|dist)-packages[/\\]")


@dataclass(frozen=True, slots=True)
class PyWarning:
    """A warning as Python's ``warnings`` module prints it."""

    category: str
    message: str
    where: str
    """``torch/distributed/c10d_logger.py:83``: the file (inside its package where it is one) and line."""


def parse_warning(text: str) -> PyWarning | None:
    """The warning ``text`` prints (``/…/site-packages/torch/x.py:83: FutureWarning: …``); None for another line."""
    m = _WARNING.match(text)
    if m is None:
        return None
    where = _PACKAGES.sub("", m["path"]) + ":" + m["line"]
    return PyWarning(m["category"], m["message"].strip(), where)


@dataclass(slots=True)
class LogEntry:
    """One line of the pane: a line as it came, or a warning and how often it came."""

    sources: list[str]
    """Who printed it (``runner``, ``r0``…), in the order they first did."""
    text: str
    warning: PyWarning | None = None
    count: int = 1
    version: int = 0
    """Counts the changes since it was made (a repeat of its warning), for the pane's caches."""

    @property
    def label(self) -> str:
        """``r0``; ``r0,r1`` for a warning two ranks printed; ``r0+7`` for eight."""
        if len(self.sources) <= 2:
            return ",".join(self.sources)
        return f"{self.sources[0]}+{len(self.sources) - 1}"

    @property
    def words(self) -> str:
        """The line, or ``FutureWarning ×6: message (where)``: the count only where it came more than once."""
        w = self.warning
        if w is None:
            return self.text
        times = f" ×{self.count}" if self.count > 1 else ""
        return f"{w.category}{times}: {w.message} ({w.where})"


@dataclass
class FoldedLog:
    """The log so far, warnings folded (``add``)."""

    entries: list[LogEntry] = field(default_factory=list)
    _warnings: dict[PyWarning, int] = field(default_factory=dict)
    _after_warning: set[str] = field(default_factory=set)
    """Sources whose latest line was a warning: their next indented line is its source line."""

    def add(self, lines: Iterable[LogLine]) -> set[int]:
        """Take new lines in; returns the indices of the entries made or changed.  When old entries had to go
        (``MAX_ENTRIES``), every index moved: then it returns every index."""
        changed: set[int] = set()
        for line in lines:
            changed |= self._add(line)
        if len(self.entries) > MAX_ENTRIES:
            del self.entries[: len(self.entries) - MAX_ENTRIES]
            self._warnings = {e.warning: i for i, e in enumerate(self.entries) if e.warning is not None}
            return set(range(len(self.entries)))
        return changed

    def _add(self, line: LogLine) -> set[int]:
        if line.source in self._after_warning:
            self._after_warning.discard(line.source)
            if line.text[:1].isspace():  # the source line Python prints under a warning
                return set()
        warning = parse_warning(line.text)
        if warning is None:
            self.entries.append(LogEntry([line.source], line.text))
            return {len(self.entries) - 1}
        self._after_warning.add(line.source)
        at = self._warnings.get(warning)
        if at is None:
            self._warnings[warning] = len(self.entries)
            self.entries.append(LogEntry([line.source], line.text, warning))
            return {len(self.entries) - 1}
        entry = self.entries[at]
        entry.count += 1
        entry.version += 1
        if line.source not in entry.sources:
            entry.sources.append(line.source)
        return {at}
