"""The probe: runs inside training ranks and writes what it sees as events.

Lightning users add ``shardtop.ShardtopCallback()``; raw PyTorch / DeepSpeed
loops use ``attach``, ``watch``, ``phase`` and ``step`` from here.
"""

from shardtop.probe.api import attach, phase, probe, step, watch

__all__ = ["attach", "phase", "probe", "step", "watch"]
