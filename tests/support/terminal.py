"""A process started as a terminal starts it: SIGHUP at its default, whatever the test run inherited."""

from __future__ import annotations

import signal


def hangup_ends_it() -> None:
    """``preexec_fn`` for a process that a dropped terminal should end.

    A suite started under ``nohup`` (or by anything that ignores SIGHUP) passes the ignored signal on
    to every process it starts, and a hang-up would then end nothing.
    """
    signal.signal(signal.SIGHUP, signal.SIG_DFL)
