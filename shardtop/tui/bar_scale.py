"""What each rank's memory bar measures against, in words: the limit that applies to the rank.

A GPU rank's bar is drawn against what the rank may use before it runs out (``RunModel.memory_limit_of``):
its cap (``gpu_mem_limit``), else its GPU's memory.  A CPU rank's bar shows its resident memory (rss), so
it is drawn against memory of the same kind: its container's memory limit, else its host's memory.  A cap
on CPU limits the rank's data segment (``RLIMIT_DATA``), which rss does not measure: it is said in words
beside the bars (``cpu_cap_words``), never drawn as their end.  The panel's title says what the bars
measure against, so a bar that looks full is full.
"""

from __future__ import annotations

from collections.abc import Iterable

from shardtop.read.rank_facts import RankFacts
from shardtop.units import format_bytes, short_bytes


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


def host_scale(r: RankFacts) -> tuple[int | None, str]:
    """What a CPU rank's resident memory is drawn against, and its words: ``host memory limit`` (its
    container's) or ``host memory``; (None, "") before the rank has said."""
    hello = r.hello
    if hello is not None and hello.host_memory_limit:
        return hello.host_memory_limit, "host memory limit"
    if hello is not None and hello.host_memory:
        return hello.host_memory, "host memory"
    return None, ""


def cpu_cap_words(limits: Iterable[int], short: bool = False) -> str:
    """``capped: +150 MiB data segment (RLIMIT_DATA), not rss`` (``short``: ``cap +150M data segment``):
    what ``gpu_mem_limit`` caps on CPU, where the bars show rss; empty without a cap."""
    distinct = sorted(set(limits))
    if not distinct:
        return ""
    if short:
        return f"cap +{'/'.join(short_bytes(x) for x in distinct)} data segment"
    told = "…".join(format_bytes(x) for x in dict.fromkeys((distinct[0], distinct[-1])))
    return f"capped: +{told} data segment (RLIMIT_DATA), not rss"


SHORT_WORDS = {"host memory": "host RAM", "host memory limit": "RAM limit"}
"""What a narrow panel's title calls the host's memory."""


def scale_title(scales: Iterable[tuple[int | None, str]], short: bool = False) -> str:
    """``of 23.5 GiB host memory`` (``short``: ``of 23.5G host RAM``) when every bar measures against the
    same (bytes, words); else empty."""
    distinct = set(scales)
    if len(distinct) != 1:
        return ""
    whole, words = distinct.pop()
    if short:
        return f"of {short_bytes(whole)} {SHORT_WORDS.get(words, words)}" if whole and words else ""
    return f"of {format_bytes(whole)} {words}" if whole and words else ""
