"""The GPU a plan is judged against: a known card, a size, the local GPU, or none.

Sizes are the cards' memory as NVML reports it where it was seen (H200:
143771 MiB on the recording machine), otherwise the nominal size.  Not all of
it is PyTorch's: the CUDA context, cuBLAS/cuDNN handles and NCCL take some
before the first tensor (1.14 GiB on an H200 with torch 2.11 in a recorded
run, from the out-of-memory message's "non-PyTorch memory").  A plan
against a card keeps that much aside; a ``gpu_mem_limit`` caps PyTorch's
allocator itself, so nothing is kept aside from it.

Nor can the allocator hand out every byte it holds: blocks are rounded and
split, so a plan closer than ``FRAGMENTATION`` to the limit is not called a
fit.  That share is an allowance set from one run, not a measurement of the
allocator: ZeRO-3's first Adam step at 4000 layers, rank 0 of two under a
15 GiB cap, ran out asking for 1.96 GiB with 12.55 GiB allocated (14.51 GiB of
15, 96.7 %).  In the other capped recordings no request failed inside the
usable share, except at DeepSpeed's set-up (planned by the memory the
allocator holds) and in a script that fragments its memory on purpose
(``tests/unit/test_fragmentation_allowance.py``).  No torch here.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from shardtop.config import parse_size
from shardtop.units import GiB, MiB, format_bytes

NON_PYTORCH_BYTES = int(1.14 * GiB)
"""Device memory that is not PyTorch's (CUDA context, library handles), kept aside on a real card."""
FRAGMENTATION = 0.05
"""Share of the allocator's limit a plan leaves for rounding and split blocks: an allowance, set from one
recorded out-of-memory run (see above)."""

CARDS: dict[str, int] = {
    "H200": 143771 * MiB,
    "H100-80GB": 80 * GiB,
    "H100-94GB": 94 * GiB,
    "A100-80GB": 80 * GiB,
    "A100-40GB": 40 * GiB,
    "V100-32GB": 32 * GiB,
    "V100-16GB": 16 * GiB,
    "L40S": 48 * GiB,
    "A6000": 48 * GiB,
    "A10": 24 * GiB,
    "L4": 24 * GiB,
    "RTX-4090": 24 * GiB,
    "RTX-3090": 24 * GiB,
    "T4": 16 * GiB,
}
"""Known cards by name; ``gpu=`` matches them ignoring case, spaces, dashes and an ``NVIDIA`` prefix."""

ALIASES = {"H100": "H100-80GB"}


@dataclass(frozen=True)
class Gpu:
    """What "fits" means: the card's memory and how much of it PyTorch may use."""

    name: str
    """``H200``, ``16 GiB`` or the local GPU's NVML name."""
    total: int
    usable: int
    """What a plan's peak may reach: the allocator's share, less the fragmentation allowance."""
    source: str
    """Where the size came from: gpu=, gpu_mem_limit, local GPU."""


class UnknownGpu(ValueError):
    """``gpu=`` is neither a size nor a known card; the message lists the cards."""


def _key(name: str) -> str:
    return re.sub(r"[\s_\-]", "", name.upper()).removeprefix("NVIDIA")


def known_cards() -> str:
    return ", ".join(CARDS)


def card(name: str, total: int, source: str) -> Gpu:
    return Gpu(name=name, total=total, usable=_allowed(total - NON_PYTORCH_BYTES), source=source)


def _allowed(allocator_limit: int) -> int:
    return max(0, int(allocator_limit * (1 - FRAGMENTATION)))


def parse_gpu(text: str) -> Gpu:
    """``gpu=`` as typed: a size (``16GiB``) or a card (``A100-80GB``)."""
    raw = text.strip()
    try:
        total = parse_size(raw)
    except ValueError:
        pass
    else:
        if total <= 0:
            raise UnknownGpu(f"gpu={raw}: a GPU needs some memory; expected e.g. gpu=16GiB or gpu=A100-80GB.")
        return card(format_bytes(total), total, f"gpu={raw}")
    wanted = _key(raw)
    for name, total in CARDS.items():
        if _key(name) == wanted:
            return card(name, total, f"gpu={raw}")
    for alias, name in ALIASES.items():
        if _key(alias) == wanted:
            return card(name, CARDS[name], f"gpu={raw}")
    raise UnknownGpu(
        f"gpu={raw}: expected a size such as 16GiB or 80GB, or a known card: {known_cards()}."
    )


def limited(limit: int) -> Gpu:
    """``gpu_mem_limit`` acts as the card: it caps PyTorch's allocator, all of it usable."""
    return Gpu(
        name=f"{format_bytes(limit)} (gpu_mem_limit)", total=limit, usable=_allowed(limit), source="gpu_mem_limit"
    )


def judged_against(gpu: Gpu | None, limit: int | None) -> Gpu | None:
    """What a rank may really use: the card, or ``gpu_mem_limit`` where that allows less (or there is no card)."""
    if not limit:
        return gpu
    capped = limited(int(limit))
    return capped if gpu is None or capped.usable < gpu.usable else gpu


def local_gpu() -> Gpu | None:
    """The first local GPU as NVML sees it, or None without a driver."""
    from shardtop.gpus import nvml_or_none

    nvml = nvml_or_none()
    if nvml is None or nvml.count == 0:
        return None
    first = nvml.sample(with_processes=False)[0]
    name = first.name.removeprefix("NVIDIA ").strip() or "local GPU"
    return card(name, first.total, "local GPU")
