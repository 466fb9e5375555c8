"""The cyclic garbage collector held off while many short-lived objects are made at once: the probe's reads,
a model described on the meta device, events folded into a run's state."""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator


@contextlib.contextmanager
def collector_paused() -> Iterator[None]:
    """No automatic collection inside the block (one already paused stays paused).

    A read that makes thousands of short-lived objects (a node per autograd node walked, a storage per tensor
    counted) triggers young collections that promote whatever is alive at that moment; promoted, those objects
    bring the next full collection (a scan of everything alive, a tenth of a second in a large process) nearer.
    Paused, they are gone before any collection sees them.
    """
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()
