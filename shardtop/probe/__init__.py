"""The probe: runs inside training ranks and writes what it sees as events.

Lightning users add ``shardtop.ShardtopCallback()``; raw PyTorch / DeepSpeed
loops use ``attach``, ``watch``, ``phase`` and ``step`` from here.  They are
imported when first asked for, so that a module of the probe that needs no
torch (``allocating_code``, ``exits``...) can be imported without it.
"""

from __future__ import annotations

TYPE_CHECKING = False  # not typing's: see shardtop/__init__.py
if TYPE_CHECKING:
    from typing import Any

    from shardtop.probe.api import attach, phase, probe, step, watch

__all__ = ["attach", "phase", "probe", "step", "watch"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from shardtop.probe import api

        return getattr(api, name)
    raise AttributeError(f"module 'shardtop.probe' has no attribute {name!r}")
