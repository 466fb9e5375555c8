"""What the kind ``other`` holds, by what made it, in the words every view uses.

A split that tells its parts (``MemorySplit.other_parts``) is read as it is, each part with the places of
``other_at`` that are its own.  A recording made before parts were told has only those places (the three
largest): a place with no Python frame is named as the backward's (the only way the probe put such a
block under ``other``, but for a module buffer allocated before the trace began), one in a ``backward``
as an autograd Function's, one in a ``forward`` as a forward's tensor saved for no backward; any other
place is said as a place, and what no place names is left unnamed (such a recording never names the loss's
part: it read what the loss made of the model's output as the script's tensors or the activations).

The forward's part is "saved for no backward" only once that forward is over: at a moment inside a module's
forward it is what the forward running then was making (its activations on their way, its temporaries), which
grows with the tokens of a micro-batch.  A split's phase alone does not tell it (the phase stays ``forward``
while the loss is computed after the model returned): an OOM does, by the modules on its stack
(``running_forward``), for its own split and for a peak that is its moment.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from shardtop.rundir.events import Oom
from shardtop.rundir.memory_figures import OTHER_PARTS, AllocationSite, MemorySplit, OtherPart
from shardtop.units import format_bytes

PART_WORDS: dict[OtherPart, str] = {
    "backward": "made by autograd in the backward (gradients in flight: each activation's gradient, and that "
    "of what the loss was computed from, such as the logits)",
    "output": "the model's output, still held (a language model's logits, its head's output)",
    "loss": "what the loss made of the model's output, still held (an fp32 copy of the logits, their "
    "log-softmax)",
    "forward": "made in a forward and saved for no backward (a module's output still held, or a temporary)",
    "optimizer": "temporaries of the optimizer step",
    "buffers": "module buffers",
}
"""What each part is, in a sentence of its own."""

PART_SHORT: dict[OtherPart, str] = {
    "backward": "gradients in flight in the backward",
    "output": "the model's output",
    "loss": "what the loss made of the model's output",
    "forward": "a forward's tensors saved for no backward",
    "optimizer": "optimizer step temporaries",
    "buffers": "module buffers",
}
"""Each part in a few words, inside a sentence that lists the kinds."""

RUNNING_FORWARD_PHASES = frozenset({"forward", "validation"})
"""The phases in which a module's forward may be running, no backward begun."""

RUNNING_FORWARD_WORDS = (
    "made by the forward running then (activations it was making and its temporaries), which grow with the "
    "tokens of a micro-batch"
)
RUNNING_FORWARD_SHORT = "the running forward's tensors"


def running_forward(split: MemorySplit | None, oom: Oom | None) -> bool:
    """``split`` is a moment inside a module's forward: the moment of ``oom`` (its phase and step, as many
    bytes allocated), an OOM raised with modules' ``forward`` frames on its stack in a forward's phase."""
    return (
        split is not None and oom is not None and oom.phase in RUNNING_FORWARD_PHASES
        and oom.attributed_by == "forward-frame" and bool(oom.module_stack)
        and split.phase == oom.phase and split.step == oom.step
        and split.allocated is not None and split.allocated == oom.allocated
    )


def part_words(part: OtherPart, running: bool) -> str:
    """``PART_WORDS[part]``, the forward's part as the running forward's at a moment inside a forward."""
    return RUNNING_FORWARD_WORDS if part == "forward" and running else PART_WORDS[part]


def part_short(part: OtherPart, running: bool) -> str:
    """``PART_SHORT[part]``, the forward's part as the running forward's at a moment inside a forward."""
    return RUNNING_FORWARD_SHORT if part == "forward" and running else PART_SHORT[part]


@dataclass(frozen=True, slots=True)
class OtherShare:
    """Some bytes of ``other``: a part (None: what made them is not told), and the places that allocated
    them, as the split kept them."""

    part: OtherPart | None
    bytes: int
    sites: tuple[AllocationSite, ...] = ()


def site_part(site: AllocationSite) -> OtherPart | None:
    """The part a place of ``other`` holds: as recorded, else what the place says (see the module docstring)."""
    if site.part is not None:
        return site.part
    if not site.where or site.where.endswith(" in backward"):
        return "backward"
    if site.where.endswith(" in forward"):
        return "forward"
    return None


def other_shares(split: MemorySplit) -> tuple[OtherShare, ...]:
    """``other`` by part, largest first: the parts the split tells, else those its places tell (an older
    recording), with what no part holds as one share of part None.  Empty where ``other`` is 0 or unmeasured."""
    other = split.by_kind.other or 0
    if other <= 0:
        return ()
    if split.other_parts is not None:
        shares = [
            OtherShare(part, size, tuple(s for s in split.other_at if s.part == part))
            for part in OTHER_PARTS
            if (size := getattr(split.other_parts, part))
        ]
    else:
        grouped: dict[OtherPart | None, list[AllocationSite]] = {}
        for site in split.other_at:
            grouped.setdefault(site_part(site), []).append(site)
        shares = [OtherShare(part, sum(s.bytes for s in sites), tuple(sites)) for part, sites in grouped.items()]
    named = sum(share.bytes for share in shares if share.part is not None)
    shares = [share for share in shares if share.part is not None]
    if other > named:
        shares.append(OtherShare(None, other - named, tuple(s for s in split.other_at if site_part(s) is None)))
    return tuple(sorted(shares, key=lambda share: -share.bytes))


def parts_dict(split: MemorySplit) -> dict[str, int]:
    """The JSON form: bytes per named part (docs/report-json.md)."""
    return {share.part: share.bytes for share in other_shares(split) if share.part is not None}


def unnamed_other(split: MemorySplit) -> int:
    """The bytes of ``other`` no part names."""
    return sum(share.bytes for share in other_shares(split) if share.part is None)


def parts_words(parts: Mapping[str, int], total: int, min_share: float, running: bool = False) -> str:
    """``1.95 GiB gradients in flight in the backward, 500 MiB the model's output``: the parts of at least
    ``min_share`` of ``total``, largest first, in a few words each (a part that is all of ``other``, only its
    words; the forward's as the running forward's where ``running``: a moment inside a forward); empty where
    none is."""
    named = sorted(((n, p) for p, n in parts.items() if p in PART_SHORT and n and n >= min_share * total),
                   key=lambda item: -item[0])
    if len(named) == 1 and named[0][0] == sum(parts.values()):
        return part_short(named[0][1], running)
    return ", ".join(f"{format_bytes(n)} {part_short(p, running)}" for n, p in named)


def other_sentence(split: MemorySplit, min_share: float, running: bool = False) -> str | None:
    """``other: 1.95 GiB made by autograd in the backward (…), from torch's C++ code (no Python frame);
    500 MiB …, at train.py:31 in forward``: each share of ``other`` of at least ``min_share`` of the split,
    what it is and where it was allocated (what no part names: only the places kept for it); None where
    nothing is said; ``running``: the split is a moment inside a forward (``running_forward``)."""
    total = split.allocated or 0
    said: list[str] = []
    for share in other_shares(split):
        if total and share.bytes < min_share * total:
            continue
        if share.part is None:  # what no part names: its places, as the split kept them
            said.extend(_place(site, with_bytes=True) for site in share.sites)
            continue
        text = f"{format_bytes(share.bytes)} {part_words(share.part, running)}"
        if len(share.sites) == 1 and share.sites[0].bytes == share.bytes:
            text += ", " + _place(share.sites[0], with_bytes=False)
        elif share.sites:
            text += ", of it " + ", ".join(_place(site, with_bytes=True) for site in share.sites)
        said.append(text)
    return "other: " + "; ".join(said) if said else None


def _place(site: AllocationSite, with_bytes: bool) -> str:
    head = f"{format_bytes(site.bytes)} " if with_bytes else ""
    if not site.where:
        return head + "from torch's C++ code (no Python frame)"
    return f"{head}at {site.where}"
