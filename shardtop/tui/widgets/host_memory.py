"""Memory of many ranks, one line per host: what ``RankMemory`` draws past ``HOST_LINES_FROM`` ranks.

512 ranks would take 512 bars; a line per host says how many ranks it has,
their lowest and highest allocation (or RSS on CPU) against what they may use,
and the worst way one of them stands (``✗ OOM`` on the host where it struck).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from rich.style import Style
from rich.text import Text

from shardtop.run_model import RankStatus, worst_status
from shardtop.tui.format import fraction, short_bytes, split_bar
from shardtop.tui.host_groups import by_host

if TYPE_CHECKING:
    from shardtop.tui.widgets.rank_memory import RankMemoryRow

HOST_LINES_FROM = 17
"""From this many ranks over several hosts, one line per host instead of a bar per rank."""


@dataclass(frozen=True, slots=True)
class HostMemoryRow:
    """The ranks of one host on one line: how many, their lowest and highest figure, the worst status."""

    host: str
    ranks: tuple[int, ...]
    low: int
    high: int
    """Allocated bytes of the host's ranks (GPU ranks), else their host RSS."""
    reserved: int | None
    whole: int | None
    """The largest limit (or GPU size) among its ranks; None on CPU."""
    on_allocator: bool
    status: RankStatus


def host_memory_rows(rows: tuple[RankMemoryRow, ...]) -> tuple[HostMemoryRow, ...]:
    """One summary per host, hosts in name order."""
    out = []
    for host, group in by_host(rows, lambda r: r.host):
        on_allocator = any(r.allocated is not None for r in group)
        values = [(r.allocated or 0) if on_allocator else r.host_rss for r in group]
        reserved = [r.reserved for r in group if r.reserved is not None]
        wholes = [w for r in group if (w := r.whole) is not None]
        status = worst_status(r.status for r in group)
        assert status is not None  # a group is never empty
        out.append(
            HostMemoryRow(
                host=host,
                ranks=tuple(r.rank for r in group),
                low=min(values),
                high=max(values),
                reserved=max(reserved) if reserved else None,
                whole=max(wholes) if wholes and on_allocator else None,
                on_allocator=on_allocator,
                status=status,
            )
        )
    return tuple(out)


def host_lines(
    hosts: tuple[HostMemoryRow, ...],
    width: int,
    style: Callable[[str], Style],
    status: Callable[[Text, RankStatus], None],
) -> Text:
    """``gpu-a 8 ranks ✗ OOM ███▒░ 1.21G…1.96G/80.0G`` per host (narrow: ``gpu-a ×8 ✗ OOM ██░ ≤1.96G``).

    ``style``: the widget's component styles; ``status``: how the widget words a status after a label.
    """
    wide = width >= 44
    label_style, muted = style("rank-memory--label"), style("rank-memory--muted")
    used_style, held_style, free_style = (
        style("rank-memory--allocated"), style("rank-memory--reserved"), style("rank-memory--free")
    )
    labels = []
    for h in hosts:
        label = Text(h.host, label_style)
        n = len(h.ranks)
        label.append(f" {n} rank{'s' if n != 1 else ''}" if wide else f" ×{n}", muted)
        status(label, h.status)
        labels.append(label)
    label_width = max(label.cell_len for label in labels)
    top = max(h.high for h in hosts) or 1
    out = Text(no_wrap=True, overflow="ellipsis")
    for i, (h, label) in enumerate(zip(hosts, labels, strict=True)):
        low, high = short_bytes(h.low), short_bytes(h.high)
        span = (low if low == high else f"{low}…{high}") if wide else f"≤{high}"
        if h.on_allocator:
            whole = h.whole or h.high or 1
            figures = f"{span}/{short_bytes(h.whole)}" if h.whole and wide else span
        else:
            whole, figures = top, f"rss {span}"
        out.append("\n" if i else "")
        out.append_text(label)
        out.append(" " * (label_width - label.cell_len + 1))
        used, held, free = split_bar(
            fraction(h.high, whole),
            fraction(max(h.reserved or 0, h.high), whole),
            max(4, min(40, width - label_width - len(figures) - 2)),
        )
        out.append(used, used_style)
        out.append(held, held_style)
        out.append(free, free_style)
        out.append(" " + figures)
    return out
