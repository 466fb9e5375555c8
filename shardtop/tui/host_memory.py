"""Memory of many ranks, one line per host: what ``RankMemory`` draws past ``HOST_LINES_FROM`` ranks.

512 ranks would take 512 bars; a line per host says how many ranks it has,
their lowest and highest allocation (or RSS on CPU) against what they may use,
and the worst way one of them stands (``✗ OOM`` on the host where it struck).
When the hosts do not fit, the worst come first (then by name) and the last
line sums up the hosts left out, so a failing host is never the one hidden.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from rich.style import Style
from rich.text import Text

from shardtop.read.rank_facts import SEVERITY, RankStatus, worst_status
from shardtop.tui.format import fraction, split_bar
from shardtop.tui.host_groups import by_host
from shardtop.tui.rank_memory_rows import RankMemoryRow
from shardtop.units import short_bytes
from shardtop.words import plural

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
    """The largest limit (or GPU size) among its ranks; on CPU, their host's memory (limit)."""
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
                whole=max(wholes) if wholes else None,
                on_allocator=on_allocator,
                status=status,
            )
        )
    return tuple(out)


def fitted(hosts: tuple[HostMemoryRow, ...], room: int) -> tuple[HostMemoryRow, ...]:
    """``hosts`` in ``room`` lines: all of them, or the worst ``room - 1`` and one line summing up the rest."""
    if len(hosts) <= room:
        return hosts
    ordered = sorted(hosts, key=lambda h: (-SEVERITY.index(h.status.state), h.host))
    shown, rest = ordered[: max(0, room - 1)], ordered[max(0, room - 1) :]
    wholes = [h.whole for h in rest if h.whole is not None]
    status = worst_status(h.status for h in rest)
    assert status is not None
    summed = HostMemoryRow(
        host=f"+{len(rest)} hosts",
        ranks=tuple(r for h in rest for r in h.ranks),
        low=min(h.low for h in rest),
        high=max(h.high for h in rest),
        reserved=max((h.reserved for h in rest if h.reserved is not None), default=None),
        whole=max(wholes) if wholes else None,
        on_allocator=any(h.on_allocator for h in rest),
        status=status,
    )
    return (*shown, summed)


def host_lines(
    hosts: tuple[HostMemoryRow, ...],
    width: int,
    style: Callable[[str], Style],
    status: Callable[[Text, RankStatus], None],
    room: int,
) -> Text:
    """``gpu-a 8 ranks ✗ OOM ███▒░ 1.21G…1.96G/80.0G`` per host (narrow: ``gpu-a ×8 ✗ OOM ██░ ≤1.96G``),
    in ``room`` lines (``fitted``).

    ``style``: the widget's component styles; ``status``: how the widget words a status after a label.
    """
    hosts = fitted(hosts, room)
    wide = width >= 44
    label_style, muted = style("rank-memory--label"), style("rank-memory--muted")
    used_style, held_style, free_style = (
        style("rank-memory--allocated"), style("rank-memory--reserved"), style("rank-memory--free")
    )
    labels = []
    for h in hosts:
        label = Text(h.host, label_style)
        n = len(h.ranks)
        label.append(f" {plural(n, 'rank')}" if wide else f" ×{n}", muted)
        if wide:
            status(label, h.status)
        elif h.status.ended or h.status.state == "stalled":  # narrow: the mark, and OOM or stalled by name
            word = {"out of memory": " OOM", "stalled": " stalled"}.get(h.status.state, "")
            finished = h.status.state == "finished"
            label.append(f" {h.status.mark}{word}", muted if finished else style("rank-memory--oom"))
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
            whole, figures = h.whole or top, f"rss {span}" + (f"/{short_bytes(h.whole)}" if h.whole and wide else "")
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
