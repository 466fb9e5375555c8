"""What each rank's memory bar measures against, in words: the limit that applies to the rank.

A bar is drawn against what the rank may use before it runs out (``RunModel.memory_limit_of``): its cap
(``gpu_mem_limit``), else its GPU's memory, else, on CPU, the host's memory limit or memory.  The panel's
title says which, so a bar that looks full is full.
"""

from __future__ import annotations

from collections.abc import Iterable

from shardtop.read.rank_facts import RankFacts
from shardtop.units import format_bytes


def may_use_words(r: RankFacts) -> str:
    """What ``RunModel.memory_limit_of`` measures the rank against: ``cap``, ``GPU``, ``host memory limit``
    or ``host memory``."""
    m = r.memory
    if (m is not None and m.limit) or (r.oom is not None and r.oom.limit):
        return "cap"
    if r.device.startswith("cuda:"):
        return "GPU"
    hello = r.hello
    return "host memory limit" if hello is not None and hello.host_memory_limit else "host memory"


def scale_title(scales: Iterable[tuple[int | None, str]]) -> str:
    """``of 23.5 GiB host memory`` when every bar measures against the same (bytes, words); else empty."""
    distinct = set(scales)
    if len(distinct) != 1:
        return ""
    whole, words = distinct.pop()
    return f"of {format_bytes(whole)} {words}" if whole and words else ""
