"""This process's probe: the one its training rank writes through, forgotten in a forked child."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from shardtop.probe.exits import install as install_exit_hooks

if TYPE_CHECKING:
    from shardtop.probe.session import Probe

_current: Probe | None = None


def current() -> Probe | None:
    return _current


def _forget_in_child() -> None:
    """A process forked from a rank (a DataLoader worker) is not the rank: it stays quiet."""
    global _current
    _current = None


os.register_at_fork(after_in_child=_forget_in_child)


def set_current(probe: Probe | None) -> None:
    """Make ``probe`` this process's probe; its ending is then recorded however the process ends."""
    global _current
    _current = probe
    if probe is not None:
        install_exit_hooks(current)
