"""Run several scenarios in one set of rank processes, each recorded as a run of its own.

Starting torch, the process group and DeepSpeed costs more than a small scenario itself: the
``more_*.py`` scripts take the scenarios to run on their command line and record each into a
run directory named after it, one after the other.
"""

from __future__ import annotations

import sys
from collections.abc import Callable

import torch

import shardtop.probe as st
from shardtop.probe.current import current, set_current


def record_each(names: list[str], scenarios: dict[str, Callable[[], None]], driver: str = "") -> None:
    """Run each named scenario under ``shardtop.probe.watch`` into a run of its own.  A scenario
    that fails (an OOM it provokes) is recorded as such, and the next one still runs."""
    unknown = [n for n in names if n not in scenarios]
    if unknown or not names:
        sys.exit(f"scenarios to run: {', '.join(scenarios)} (got {', '.join(unknown) or 'none'})")
    for name in names:
        torch.manual_seed(0)  # every rank builds the same model
        try:
            with st.watch(name=name) as recording:
                if driver:
                    recording.extra_info["driver"] = driver
                scenarios[name]()
        except RuntimeError as e:
            print(f"{name}: {type(e).__name__}: {str(e).splitlines()[0]}", file=sys.stderr)
        probe = current()
        if probe is not None:
            probe.close()
        set_current(None)
