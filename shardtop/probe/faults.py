"""When the probe itself fails: once per part, in the rank's log and as a ``Fault`` event.

Training is what the user came for; the probe must never take it down.  Each
part of the probe (``FAULT_PARTS``: the shard reader, the memory sampler...)
runs under ``Faults.guard(part)``: an exception there is written once to the
rank's log (stderr) and as a ``Fault`` event, and that part is switched off
for the rest of the run while training goes on.

Only ``Exception`` is caught.  ``KeyboardInterrupt`` and ``SystemExit`` come
from the user's signal handlers (or Ctrl-C) and go on exactly as they would
without the probe.
"""

from __future__ import annotations

import sys
import traceback
from collections.abc import Callable
from types import TracebackType
from typing import Literal

from shardtop.rundir.events import FAULT_PARTS, Fault

FaultPart = Literal["events", "shards", "memory", "names", "oom", "steps", "run", "split", "snapshots", "kept"]
"""The probe's parts, each switched off alone when it fails (``Fault.part``; ``FAULT_PARTS`` words them)."""

MAX_ERROR = 2000
SWITCHED_OFF = "it is switched off"


def describe(error: BaseException) -> str:
    """``Type: message`` of an exception, at most ``MAX_ERROR`` characters; never raises."""
    try:
        text = "".join(traceback.format_exception_only(type(error), error)).strip()
    except Exception:  # noqa: BLE001 - an exception whose str() fails, or no memory left
        text = type(error).__name__
    return text if len(text) <= MAX_ERROR else text[: MAX_ERROR - 1] + "…"


def say(line: str) -> None:
    """One line to the rank's log; a full disk or a closed stderr loses the line, nothing more."""
    try:
        sys.stderr.write(line + "\n")
        sys.stderr.flush()
    except Exception:  # noqa: BLE001
        pass


class Faults:
    """Which parts of one rank's probe failed, and how that was told."""

    def __init__(self, rank: int, write: Callable[[Fault], object]) -> None:
        self.rank = rank
        self.write = write
        self.off: set[FaultPart] = set()
        """Parts switched off for the rest of the run."""
        self.told: dict[FaultPart, str] = {}
        """What was said about each part that failed (once per part)."""

    def working(self, part: FaultPart) -> bool:
        return part not in self.off

    def report(self, part: FaultPart, error: BaseException | str, *, then: str = SWITCHED_OFF) -> None:
        """Tell once per part that it failed; ``then`` says what the probe does about it.

        With the default, the part is also switched off.
        """
        if then == SWITCHED_OFF:
            self.off.add(part)
        if part in self.told:
            return
        text = error if isinstance(error, str) else describe(error)
        self.told[part] = text
        words = FAULT_PARTS.get(part, part)
        say(f"shardtop: the probe's {words} failed on rank {self.rank}: {text}. {then[:1].upper()}{then[1:]}; "
            "training goes on.")
        self.write(Fault(part=part, error=text))

    def guard(self, part: FaultPart) -> Guard:
        """``with faults.guard("shards"): ...`` — an ``Exception`` inside is reported, not raised."""
        return Guard(self, part)


class Guard:
    """The context manager ``Faults.guard`` returns; ``failed`` says whether the block raised."""

    def __init__(self, faults: Faults, part: FaultPart) -> None:
        self.faults = faults
        self.part = part
        self.failed = False

    def __enter__(self) -> Guard:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, tb: TracebackType | None
    ) -> bool:
        if error is None or not isinstance(error, Exception):
            return False
        self.failed = True
        try:
            self.faults.report(self.part, error)
        except Exception:  # noqa: BLE001 - even telling may fail (no memory): training still goes on
            self.faults.off.add(self.part)
        return True
