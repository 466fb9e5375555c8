"""What fills a rank's memory, by kind, in the words every view uses.

A ``MemorySplit`` (from the probe) says how many bytes of the allocator's
``allocated`` each kind holds, measured from its own source, and what no source
accounts for (``unexplained``).  Here it becomes the rows a bar, a sentence or a
JSON object shows, in one order, so the TUI, the report and the JSON agree.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Literal

from shardtop.read.other_parts import other_sentence, parts_dict, parts_words, site_part
from shardtop.rundir.json_files import JsonObject
from shardtop.rundir.memory_figures import AllocationSite, MemorySplit
from shardtop.units import format_bytes
from shardtop.words import list_names, noun

Kind = Literal["params", "grads", "optimizer", "activations", "kept", "script", "comm", "workspace", "other"]

KINDS: tuple[Kind, ...] = (
    "params", "grads", "optimizer", "activations", "kept", "script", "comm", "workspace", "other",
)
"""The kinds, in the order bars stack them and sentences list them (largest first there)."""

KIND_WORDS: dict[str, str] = {
    "params": "parameters",
    "grads": "gradients",
    "optimizer": "optimizer state",
    "activations": "activations",
    "kept": "kept from earlier steps",
    "script": "made by the script",
    "comm": "communication buffers",
    "workspace": "library workspaces",
    "other": "other",
    "unexplained": "unexplained",
}

KIND_SHORT: dict[str, str] = {
    "params": "param",
    "grads": "grad",
    "optimizer": "optim",
    "activations": "act",
    "kept": "kept",
    "script": "script",
    "comm": "comm",
    "workspace": "wksp",
    "other": "other",
    "unexplained": "?",
}
"""One word per kind for a legend at 80 columns."""


TRACE_SHARE = 1000
"""A sentence leaves out kinds (and unexplained bytes) under a thousandth of the total: rounding, not
memory.  The JSON and the report's table keep every byte."""


@dataclass(frozen=True, slots=True)
class KindBytes:
    kind: str
    """One of ``KINDS``, or ``unexplained``."""
    bytes: int


def bytes_by_kind(split: MemorySplit) -> dict[str, int | None]:
    """Each kind's bytes (None: its source was not read), keyed by the kind's name, in ``KINDS`` order."""
    return {k: getattr(split.by_kind, k) for k in KINDS}


def measured(split: MemorySplit) -> tuple[KindBytes, ...]:
    """The kinds a source measured (None: not read, left out), in ``KINDS`` order, then ``unexplained``
    when it is above zero."""
    rows = [KindBytes(k, v) for k, v in bytes_by_kind(split).items() if v is not None]
    if split.unexplained is not None and split.unexplained > 0:
        rows.append(KindBytes("unexplained", split.unexplained))
    return tuple(rows)


def explained_bytes(split: MemorySplit) -> int:
    """The bytes some source accounts for."""
    return sum(r.bytes for r in measured(split) if r.kind != "unexplained")


def total_of(split: MemorySplit) -> int:
    """``allocated`` where the allocator was read (CUDA), else the kinds summed (CPU)."""
    return split.allocated if split.allocated is not None else explained_bytes(split)


def explained_share(split: MemorySplit) -> float | None:
    """The share of ``allocated`` the sources explain; None without an allocator (CPU)."""
    if not split.allocated:
        return None
    return min(1.0, max(0.0, (split.allocated - max(split.unexplained or 0, 0)) / split.allocated))


def split_sentence(split: MemorySplit, requested: int | None = None, limit: int = 4, running: bool = False) -> str:
    """``12.6 GiB allocated: 9.4 GiB optimizer state, 2.0 GiB parameters, …; asked for 1.96 GiB more``.

    The ``limit`` largest kinds are named, the rest summed as ``x more``; unexplained bytes are
    always named, and ``other``'s parts after it (``running``: the split is a moment inside a forward,
    ``other_parts.running_forward``).  On CPU (no allocator) the sentence starts from the kinds' sum.
    """
    return kinds_sentence(split.allocated, bytes_by_kind(split), split.unexplained, requested, limit,
                          parts_dict(split), running)


def kinds_sentence(
    allocated: int | None,
    by_kind: Mapping[str, int | None],
    unexplained: int | None,
    requested: int | None = None,
    limit: int = 4,
    other_parts: Mapping[str, int] | None = None,
    running: bool = False,
) -> str:
    """``split_sentence`` from the figures alone (as a finding's evidence keeps them); ``other_parts``:
    what ``other`` holds, by part (``other_parts.py``), said after it where a part is worth saying (``running``:
    a moment inside a forward, whose forward part is the running forward's)."""
    rows = sorted(
        (KindBytes(k, v) for k in KINDS if (v := by_kind.get(k)) is not None and v > 0), key=lambda r: -r.bytes
    )
    total = allocated if allocated is not None else sum(r.bytes for r in rows)
    rows = [r for r in rows if r.bytes * TRACE_SHARE >= total]  # 2 B of gradients beside 11.7 GiB: noise
    shown = rows if len(rows) <= limit + 1 else rows[:limit]  # one kind left over is named, not summed
    named = [f"{format_bytes(r.bytes)} {KIND_WORDS[r.kind]}" for r in shown]
    if other_parts and (parts := parts_words(other_parts, total, 1 / TRACE_SHARE, running)):
        named = [f"{text} ({parts})" if r.kind == "other" else text for r, text in zip(shown, named, strict=False)]
    if len(shown) < len(rows):
        named.append(f"{format_bytes(sum(r.bytes for r in rows[limit:]))} in {len(rows) - limit} more kinds")
    if unexplained is not None and unexplained > 0 and unexplained * TRACE_SHARE >= total:
        named.append(f"{format_bytes(unexplained)} unexplained")
    head = (
        f"{format_bytes(allocated)} allocated"
        if allocated is not None
        else f"{format_bytes(sum(r.bytes for r in rows))} in tensors"
    )
    text = head + (": " + ", ".join(named) if named else ": nothing a source could name")
    if requested is not None:
        text += f"; asked for {format_bytes(requested)} more"
    return text


def split_dict(split: MemorySplit | None) -> JsonObject | None:
    """The JSON form (docs/report-json.md): ``{allocated, by_kind, unexplained, unexplained_at, script_at,
    kept_at, other_at, other_parts, phase, step, source}``."""
    if split is None:
        return None
    return {
        "allocated": split.allocated,
        "by_kind": bytes_by_kind(split),
        "unexplained": split.unexplained,
        "unexplained_at": [{"where": site.where or None, "bytes": site.bytes} for site in split.unexplained_at],
        "script_at": [{"where": site.where, "bytes": site.bytes} for site in split.script_at],
        "kept_at": [{"where": site.where or None, "bytes": site.bytes} for site in split.kept_at],
        "other_at": [{"where": site.where or None, "bytes": site.bytes, "part": site_part(site)}
                     for site in split.other_at],
        "other_parts": parts_dict(split) if split.by_kind.other else None,
        "phase": split.phase or None,
        "step": split.step,
        "source": split.source,
    }


SITES_WORTH_SAYING = 0.01
"""The share of a split's bytes from which the places that allocated the script's tensors, the kept ones, or
the bytes left unexplained, are said: below it, a few bytes of a loss scaler's or a script's scalars would
read as a problem."""


def sites_sentence(split: MemorySplit, running: bool = False) -> str | None:
    """Where the script made its tensors, where the tensors kept from earlier steps were made, where the
    unexplained bytes of ``split`` were allocated, and what ``other`` holds (``other_parts.py``), in words;
    None where the trace named no place or the bytes are under ``SITES_WORTH_SAYING`` of the split."""
    said = []
    for head, sites, total in (
        ("made by the script:", split.script_at, split.by_kind.script),
        ("kept from earlier steps, made", split.kept_at, split.by_kind.kept),
        ("unexplained bytes allocated", split.unexplained_at, split.unexplained),
    ):
        if sites and total and total > 0 and not (split.allocated and total < SITES_WORTH_SAYING * split.allocated):
            said.append(f"{head} " + "; ".join(_place(site) for site in sites))
    if (other := other_sentence(split, SITES_WORTH_SAYING, running)) is not None:
        said.append(other)
    return "; ".join(said) or None


def _place(site: AllocationSite) -> str:
    if not site.where:
        return f"{format_bytes(site.bytes)} from torch's C++ code (no Python frame)"
    return f"{format_bytes(site.bytes)} at {site.where}"


def sites_lines(peaks: Iterable[tuple[int, MemorySplit | None]], running: frozenset[int] = frozenset()) -> list[str]:
    """A line per set of ranks whose peaks' script tensors and unexplained bytes came from the same places
    (``sites_sentence``; ``running``: the ranks whose peak is a moment inside a forward):
    the ranks of a rehearsal tell the same ones, once."""
    said: dict[str, list[int]] = {}
    for rank, split in peaks:
        if split is not None and (words := sites_sentence(split, rank in running)):
            said.setdefault(words, []).append(rank)
    return [f"{noun(len(ranks), 'Rank')} {list_names([str(n) for n in ranks], limit=8)}: {words}."
            for words, ranks in said.items()]
