"""A rank's memory over time under its bar in ``RankMemory``: its memory at each step, and what it
leads to (memory that grows every step) or that the rank has stopped moving (stalled).

The words are pure functions, tested on their own; ``over_time_line`` styles them with the widget's
component classes, so the ``.tcss`` decides the colours and a symbol says it without them.
"""

from __future__ import annotations

from collections.abc import Callable

from rich.style import Style
from rich.text import Text

from shardtop.read.memory_growth import MIN_RISE, Growth
from shardtop.read.rank_facts import RANK_MARKS, RankStatus
from shardtop.tui.format import sparkline
from shardtop.units import format_bytes

GROWS = "↗"
"""Beside memory that grows every step, so the warning never rests on colour."""
STEPS_CELLS = 24
"""Cells of the per-step sparkline at most: the last steps, one cell each."""
MIN_CELLS = 6
"""Cells the sparkline keeps beside the growth's full words; with fewer, the words are said shorter."""


def about(seconds: float) -> str:
    """``≈ 40 s``, ``≈ 4 min``, ``≈ 3 h``, ``≈ 2 days``: how long, said roughly."""
    if seconds < 90:
        return f"≈ {seconds:.0f} s"
    if seconds < 90 * 60:
        return f"≈ {seconds / 60:.0f} min"
    if seconds < 48 * 3600:
        return f"≈ {seconds / 3600:.0f} h"
    return f"≈ {seconds / 86400:.0f} days"


def growth_words(g: Growth) -> str:
    """``grows 8 MiB/step → out of memory at ~step 2995 (≈ 4 min)``; the rate alone without a limit."""
    words = f"grows {format_bytes(g.rate)}/step"
    step = g.out_of_memory_step
    if step is None:
        return words
    words += f" → out of memory at ~step {step}"
    left = g.seconds_left
    return words + (f" ({about(left)})" if left is not None else "")


def short_growth_words(g: Growth) -> str:
    """``grows 8 MiB/step, OOM ~step 2995 (≈ 4 min)``: ``growth_words`` where the panel has no room for them."""
    step, left = g.out_of_memory_step, g.seconds_left
    words = f"grows {format_bytes(g.rate)}/step" + (f", OOM ~step {step}" if step is not None else "")
    return words + (f" ({about(left)})" if step is not None and left is not None else "")


def shows_over_time(steps: tuple[int, ...], growth: Growth | None, status: RankStatus) -> bool:
    """Whether the rank has a line over time: two steps or more, a growth, or a stall."""
    return len(steps) >= 2 or growth is not None or status.state == "stalled"


def over_time_line(
    out: Text,
    steps: tuple[int, ...],
    growth: Growth | None,
    status: RankStatus,
    width: int,
    indent: str,
    style: Callable[[str], Style],
) -> None:
    """``  ▁▂▃▄▅▆▇█ ↗ grows 8 MiB/step → …`` (or ``‖ no progress for 4 s …``) on a new line after ``indent``."""
    out.append("\n" + indent)
    room = width - len(indent)
    words = ""
    if status.state == "stalled":
        words = f"{RANK_MARKS['stalled']} stalled: {status.detail}"
    elif growth is not None:
        words = f"{GROWS} {growth_words(growth)}"
        if len(words) + 1 + MIN_CELLS > room:  # the words first: the sparkline keeps what they leave
            words = f"{GROWS} {short_growth_words(growth)}"
    cells = min(STEPS_CELLS, len(steps), max(0, room - len(words) - 1) if words else room - 16)
    if len(steps) >= 2 and cells >= 2:
        tail = steps[-cells:]
        low = min(tail)  # from the lowest step shown: a climb of 8 MiB a step shows on a 20 GiB rank too
        span = max(max(tail) - low, MIN_RISE)  # a few KB of allocator noise stays flat
        out.append(sparkline([b - low for b in tail], cells, maximum=span), style("rank-memory--steps"))
        out.append(" " if words else " memory per step", style("rank-memory--muted"))
    out.append(words, style("rank-memory--stalled" if status.state == "stalled" else "rank-memory--growth"))
