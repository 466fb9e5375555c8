"""Ranks grouped by host, as the run view draws a job over several hosts.

Which rank ran on which host is the read model's (``RunModel.ranks_by_host``,
hosts in name order); here it is only laid out: rank columns in host order with
a mark where a host begins, captions such as ``2 hosts: gpu-a r0–3 · gpu-b r4–7``,
and the rows of a panel split into one group per host.  Pure: no Textual.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TypeVar

T = TypeVar("T")

UNKNOWN_HOST = "?"
"""What a rank that has not said its host yet is grouped under."""
CAPTION_HOSTS = 8
"""Hosts named in a caption; more are counted, not named."""


def rank_spans(ranks: Sequence[int]) -> str:
    """``r0–3``, ``r0–3,8,10–11``: the ranks of a host, consecutive ones as a span."""
    spans: list[str] = []
    ordered = sorted(ranks)
    i = 0
    while i < len(ordered):
        j = i
        while j + 1 < len(ordered) and ordered[j + 1] == ordered[j] + 1:
            j += 1
        spans.append(str(ordered[i]) if i == j else f"{ordered[i]}–{ordered[j]}")
        i = j + 1
    return "r" + ",".join(spans) if spans else ""


def hosts_caption(ranks_by_host: Mapping[str, Sequence[int]], most: int = CAPTION_HOSTS) -> str:
    """``2 hosts: gpu-a r0–3 · gpu-b r4–7``; empty for a run on one host (nothing to tell apart)."""
    if len(ranks_by_host) < 2:
        return ""
    named = [f"{host} {rank_spans(ranks)}" for host, ranks in list(ranks_by_host.items())[:most]]
    more = len(ranks_by_host) - most
    return f"{len(ranks_by_host)} hosts: " + " · ".join(named) + (f" · +{more} more" if more > 0 else "")


@dataclass(frozen=True)
class RankColumn:
    """One rank's column of the shard tree, in host order."""

    rank: int
    host: str
    starts_host: bool
    """The first column of a host after another host's: drawn with a separator before it."""


def rank_columns(ranks: Sequence[int], ranks_by_host: Mapping[str, Sequence[int]]) -> tuple[RankColumn, ...]:
    """``ranks`` ordered by host (as ``ranks_by_host`` lists them), then by rank; ranks of no known host last."""
    host_of = {rank: host for host, on_host in ranks_by_host.items() for rank in on_host}
    order = {host: i for i, host in enumerate(ranks_by_host)}
    ordered = sorted(ranks, key=lambda r: (order.get(host_of.get(r, UNKNOWN_HOST), len(order)), r))
    out: list[RankColumn] = []
    for rank in ordered:
        host = host_of.get(rank, UNKNOWN_HOST)
        out.append(RankColumn(rank, host, starts_host=bool(out) and out[-1].host != host))
    return tuple(out)


def by_host(items: Sequence[T], host_of: Callable[[T], str]) -> tuple[tuple[str, tuple[T, ...]], ...]:
    """``items`` in groups of one host each: hosts in name order (unknown last), items in their order."""
    groups: dict[str, list[T]] = {}
    for item in items:
        groups.setdefault(host_of(item) or UNKNOWN_HOST, []).append(item)
    names = sorted(groups, key=lambda h: (h == UNKNOWN_HOST, h))
    return tuple((host, tuple(groups[host])) for host in names)
