"""How a rank's end is recorded, whatever ends it: a return, an exception, a signal.

``exit_record`` says what an ending was (pure).  ``install`` makes sure every
rank's ending is recorded once, even where nobody calls ``Probe.exit``
(a raw script with ``attach()`` and no ``watch()``):

* at interpreter exit (``atexit``): ``ok``; or ``error`` after an uncaught
  exception, ``interrupted`` after a signal;
* on an uncaught exception (``sys.excepthook``): the OOM record if it is one,
  then the exit, then the previous hook prints it as before;
* on SIGTERM, SIGINT and SIGHUP: the handler notes the signal (so the exit
  says ``interrupted`` and which signal) and hands it on.  It calls the
  handler that was there before (the user's, Lightning's, Python's
  ``KeyboardInterrupt``).  Where that was the default action, it records the
  exit and then ends the process by the signal, as the default would have.
  When another handler wraps this one and calls it (Lightning's does), that
  handler is in charge: without the probe it would not have ended the
  process either.  An ignored signal stays ignored; a signal is never
  swallowed.

Handlers are installed only from the main thread (the only one Python
allows), and only once per process.
"""

from __future__ import annotations

import atexit
import os
import signal
import sys
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import FrameType, MappingProxyType, TracebackType
from typing import Any, Protocol

from shardtop.probe.faults import describe
from shardtop.rundir.events import ExitStatus
from shardtop.rundir.run_status import ExitReason

ENDING_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


class Recorder(Protocol):
    """What ``install`` needs of the process's probe."""

    def record_oom(self, exc: BaseException) -> bool: ...

    def exit(self, code: int, error: BaseException | None = None) -> None: ...

    def close(self) -> None: ...


@dataclass(frozen=True)
class ExitRecord:
    """What an ending was, as the ``Exit`` event says it."""

    code: int
    status: ExitStatus
    signal: int | None = None
    error: str | None = None


RUN_ENDING: Mapping[ExitStatus, ExitReason] = MappingProxyType(
    {"ok": "finished", "error": "failed", "oom": "failed", "interrupted": "interrupted"}
)
"""The run's ending when a rank of a script's own run records it (``exit.json`` has no supervisor there)."""


def signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def exit_record(code: int, error: BaseException | None, *, oom: bool, received: int | None) -> ExitRecord:
    """The ending of a rank that leaves with ``code`` (and ``error``), after an OOM or a signal.

    A ``SystemExit`` brings its own code, and ``sys.exit(0)`` is a clean
    ending, unless a signal came first (Lightning ends a SIGTERM'd run with
    ``SIGTERMException``, a ``SystemExit`` of code 0).  ``interrupted`` needs
    an exception or a failing code: a run that caught the signal and
    finished anyway finished.
    """
    if isinstance(error, SystemExit):
        value = error.code
        code = value if isinstance(value, int) else (0 if value is None else 1)
    if oom:
        return ExitRecord(code or 1, "oom", None, describe(error) if error is not None else None)
    signum = received
    if signum is None and isinstance(error, KeyboardInterrupt):
        signum = signal.SIGINT
    elif signum is None and error is not None and type(error).__name__ == "SIGTERMException":  # Lightning's
        signum = signal.SIGTERM
    if signum is not None and (error is not None or code != 0):
        if not isinstance(error, SystemExit):
            code = 128 + signum
        return ExitRecord(code, "interrupted", int(signum), signal_name(signum))
    if isinstance(error, SystemExit) and code == 0:
        error = None
    if error is not None:
        return ExitRecord(code or 1, "error", None, describe(error))
    return ExitRecord(code, "ok" if code == 0 else "error")


# -- the process-wide hooks ---------------------------------------------------------------

_received: int | None = None
_installed = False
_signals_installed = False
_lock = threading.Lock()


def received_signal() -> int | None:
    """The last ending signal this process received since the hooks were installed."""
    return _received


def install(probe: Callable[[], Recorder | None]) -> None:
    """Record this process's ending through ``probe()`` (the current probe), once per process."""
    global _installed, _signals_installed
    with _lock:
        if not _installed:
            _installed = True
            atexit.register(_at_exit, probe)
            sys.excepthook = _ExceptHook(probe, sys.excepthook)
        if not _signals_installed and threading.current_thread() is threading.main_thread():
            _signals_installed = True
            for signum in ENDING_SIGNALS:
                _chain(signum, probe)


def _chain(signum: int, probe: Callable[[], Recorder | None]) -> None:
    try:
        previous = signal.getsignal(signum)
    except (ValueError, OSError):
        return
    if previous is None or previous == signal.SIG_IGN:
        return  # installed outside Python (cannot be handed on), or ignored: leave it as it is
    try:
        signal.signal(signum, _SignalHandler(signum, previous, probe))
    except (ValueError, OSError):
        pass


class _SignalHandler:
    """Notes an ending signal, then does what the previous handler would have done."""

    def __init__(self, signum: int, previous: Any, probe: Callable[[], Recorder | None]) -> None:
        self.signum = signum
        self.previous = previous
        self.probe = probe

    def __call__(self, signum: int, frame: FrameType | None) -> None:
        global _received
        _received = signum
        if callable(self.previous):
            self.previous(signum, frame)
            return
        if not self._installed(signum):
            return  # another handler wraps this one and decides (see the module docstring)
        recorder = self.probe()
        if recorder is not None:
            try:
                recorder.exit(128 + signum)
                recorder.close()
            except Exception:  # noqa: BLE001 - the signal must still end the process
                pass
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)


    def _installed(self, signum: int) -> bool:
        """Is this the handler Python calls for ``signum`` (not one called by a wrapper)?"""
        handler: object = signal.getsignal(signum)
        return handler is self


class _ExceptHook:
    """Records an uncaught exception (and its OOM), then lets the previous hook print it."""

    def __init__(self, probe: Callable[[], Recorder | None], previous: Callable[..., Any]) -> None:
        self.probe = probe
        self.previous = previous

    def __call__(self, kind: type[BaseException], error: BaseException, tb: TracebackType | None) -> None:
        recorder = self.probe()
        if recorder is not None:
            try:
                recorder.record_oom(error)
                recorder.exit(1, error)
            except Exception:  # noqa: BLE001
                pass
        self.previous(kind, error, tb)


def _at_exit(probe: Callable[[], Recorder | None]) -> None:
    """The interpreter is leaving: an ending nobody recorded is a clean one, unless a signal came.

    (A script that ends itself with ``sys.exit(3)`` outside ``watch()`` is
    recorded as ``ok``: the code of a ``SystemExit`` nobody caught is not
    visible to Python code.  ``watch()`` records it.)
    """
    recorder = probe()
    if recorder is None:
        return
    try:
        recorder.exit(128 + _received if _received is not None else 0)
        recorder.close()
    except Exception:  # noqa: BLE001
        pass
