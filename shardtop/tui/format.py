"""Pure formatting for the TUI: byte sizes in columns, bars, sparklines, durations, GPU and process figures.

No Textual here, so every function is unit-tested on its own, and the plain
first frame (``first_frame.py``) draws with them before Textual is loaded.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from shardtop.units import GiB, format_bytes, short_bytes
from shardtop.words import column_widths

if TYPE_CHECKING:
    from shardtop.gpus import GpuProcessInfo
    from shardtop.rundir.memory_figures import GpuMemory
    from shardtop.rundir.run_status import RunState
    from shardtop.tui.watch.run_catalog import RankOwner

__all__ = [
    "BAR_EIGHTHS",
    "BAR_EMPTY",
    "BAR_FULL",
    "BAR_RESERVED",
    "SPARKS",
    "STATUS_MARKS",
    "bar",
    "column_widths",
    "duration",
    "format_bytes",
    "fraction",
    "gpu_line_parts",
    "process_cells",
    "short_count",
    "short_path",
    "short_run_id",
    "sparkline",
    "split_bar",
    "truncate",
]

STATUS_MARKS: dict[RunState, str] = {
    "running": "●",
    "finished": "✓",
    "failed": "✗",
    "stopped": "■",
    "interrupted": "■",
    "lost": "?",
}
"""A symbol in front of every run's status word, so status never rests on colour."""

BAR_FULL = "█"
BAR_RESERVED = "▒"
BAR_EMPTY = "░"
BAR_EIGHTHS = "▏▎▍▌▋▊▉"
"""The last cell of a bar filled to 1/8 … 7/8, so a bar moves before it fills a cell."""
SPARKS = "▁▂▃▄▅▆▇█"
"""A sparkline's levels, lowest to highest: memory over time."""


def short_count(n: int) -> str:
    """Parameter counts in at most 6 cells: ``262K``, ``4.72M``, ``1.3B``."""
    value = float(n)
    for unit in ("", "K", "M", "B", "T"):
        if abs(value) < 1000 or unit == "T":
            if unit == "":
                return str(int(value))
            return (
                f"{value:.2f}{unit}"
                if abs(value) < 10
                else f"{value:.1f}{unit}"
                if abs(value) < 100
                else f"{value:.0f}{unit}"
            )
        value /= 1000
    return str(n)  # pragma: no cover


def fraction(part: int | float | None, whole: int | float | None) -> float:
    """``part / whole`` clamped to [0, 1]; 0 when either is unknown or ``whole`` is 0."""
    if not part or not whole or whole <= 0:
        return 0.0
    return max(0.0, min(1.0, float(part) / float(whole)))


def bar(frac: float, width: int) -> tuple[str, str]:
    """A bar of ``width`` cells as (filled, empty) text, with eighth-cell precision."""
    if width <= 0:
        return "", ""
    frac = max(0.0, min(1.0, frac))
    eighths = round(frac * width * 8)
    full, part = divmod(eighths, 8)
    filled = BAR_FULL * full + (BAR_EIGHTHS[part - 1] if part and full < width else "")
    return filled, BAR_EMPTY * (width - len(filled))


def split_bar(first: float, second: float, width: int) -> tuple[str, str, str]:
    """Three runs of cells: ``first`` (█), up to ``second`` (▒), the rest (░).

    Used for allocator memory: allocated inside reserved inside the limit.
    Whole cells only, so the two fills stay distinguishable without colour.
    """
    if width <= 0:
        return "", "", ""
    a = round(max(0.0, min(1.0, first)) * width)
    b = max(a, round(max(0.0, min(1.0, second)) * width))
    if first > 0 and a == 0:
        a, b = 1, max(b, 1)
    return BAR_FULL * a, BAR_RESERVED * (b - a), BAR_EMPTY * (width - b)


def sparkline(values: Sequence[int | float], width: int, maximum: float | None = None) -> str:
    """The last ``width`` values as ▁▂▃▄▅▆▇█, scaled to ``maximum`` (or their own peak)."""
    if width <= 0:
        return ""
    tail = list(values)[-width:]
    if not tail:
        return " " * width
    top = maximum if maximum else max(tail)
    if not top or top <= 0:
        cells = SPARKS[0] * len(tail)
    else:
        cells = "".join(SPARKS[min(7, max(0, int(v / top * 7.999)))] for v in tail)
    return cells.rjust(width)


def duration(seconds: float | None) -> str:
    """``12s``, ``3m07s``, ``1h02m``, ``2d03h``; ``-`` for unknown."""
    if seconds is None or seconds < 0:
        return "-"
    s = int(seconds)
    if s < 60:
        return f"{s}s"
    m, s = divmod(s, 60)
    if m < 60:
        return f"{m}m{s:02d}s"
    h, m = divmod(m, 60)
    if h < 24:
        return f"{h}h{m:02d}m"
    d, h = divmod(h, 24)
    return f"{d}d{h:02d}h"


def truncate(text: str, width: int) -> str:
    """``text`` in at most ``width`` cells, ending in ``…`` when cut."""
    if width <= 0:
        return ""
    if len(text) <= width:
        return text
    return text[: width - 1] + "…"


def short_path(path: str | os.PathLike[str]) -> str:
    """A path as short as it can be said: relative to the working directory, else with ``~``."""
    p = Path(path)
    try:
        return str(p.resolve().relative_to(Path.cwd().resolve()))
    except (ValueError, OSError):
        pass
    home = Path.home()
    try:
        return "~/" + str(p.relative_to(home))
    except ValueError:
        return str(p)


def short_run_id(run_id: str) -> str:
    """The part of a run id people tell apart: preset and suffix, without the date."""
    pieces = run_id.split("-", 2)
    return pieces[2] if len(pieces) == 3 and pieces[0].isdigit() else run_id


def gpu_line_parts(gpu: GpuMemory, width: int) -> dict[str, str]:
    """The texts of a GPU line that do not depend on colour, sized for ``width`` cells."""
    used = gpu.used / GiB
    total = gpu.total / GiB
    parts = {
        "index": f"{gpu.index:>2}",
        "name": truncate(gpu.name.replace("NVIDIA ", ""), 14 if width >= 100 else 8),
        "memory": f"{used:5.1f}/{total:.0f}G" if width < 100 else f"{used:6.1f}/{total:6.1f} GiB",
        "util": f"{gpu.util:3d}%" if gpu.util is not None else "  - ",
        "temperature": f"{gpu.temperature:3d}°C" if gpu.temperature is not None else "   - ",
        "power": f"{gpu.power_w:4.0f} W" if gpu.power_w is not None else "    - ",
    }
    return parts


PROCESS_COLUMNS = ("PID", "USER", "GPU", "GPU MEM", "CPU %", "RSS", "RUN / RANK", "COMMAND")
"""The columns of the table of processes on the GPUs, as ``process_cells`` fills them."""


def process_cells(p: GpuProcessInfo, owners: Mapping[int, RankOwner]) -> tuple[str, ...]:
    """The process table's cells for one process, in words where psutil could not look."""
    owner = owners.get(p.pid)
    run = f"{short_run_id(owner.run_id)} r{owner.rank}" if owner else ""
    gpus = ",".join(str(g) for g in p.gpus)
    if p.visibility == "not-visible":
        return (
            str(p.pid),
            "?",
            gpus,
            short_bytes(p.gpu_memory),
            "-",
            "-",
            run,
            "not visible (another pid namespace, e.g. a container)",
        )
    command = truncate(p.command, 120) if p.command else "(hidden: other user)"
    user = p.user + (" (other user)" if p.visibility == "other-user" else "")
    cpu = f"{p.cpu_percent:.0f}" if p.cpu_percent is not None else "-"
    return (str(p.pid), user, gpus, short_bytes(p.gpu_memory), cpu, short_bytes(p.host_rss), run, command)
