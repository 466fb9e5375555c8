"""Where a module's parameters are: the states and devices of its subtree, as bit masks per row.

Pure Python, no Textual: the shard model computes the masks once per build, and
the tree and the details pane read one ``Placement`` per line they draw.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from shardtop.events import Shards


@dataclass(frozen=True)
class Placement:
    """The states and devices a module's parameters (its descendants' too) are held in."""

    states: tuple[str, ...]
    devices: tuple[str, ...]

    @property
    def state(self) -> str:
        """``offloaded``; ``mixed`` over several states; empty with no parameters."""
        return self.states[0] if len(self.states) == 1 else "mixed" if self.states else ""

    @property
    def device(self) -> str:
        """``cuda:0``; ``cpu+cuda:0`` over two devices; ``mixed`` over more."""
        if len(self.devices) <= 2:
            return "+".join(self.devices)
        return "mixed"


def held_masks(shards: Shards, parents: Sequence[int], params: Sequence[int]) -> list[int]:
    """Each row's subtree as a bit mask of where its own parameters are: device bits, then state bits.

    Bit ``d`` is ``shards.devices[d]``, bit ``len(devices) + s`` is ``shards.states[s]``.
    One pass down and one up, so a 100 000-module model costs two loops, not a walk per line.
    """
    n_dev = len(shards.devices)
    out = [0] * len(parents)
    for row, (d, s) in enumerate(zip(shards.device, shards.state, strict=False)):
        if params[row] > 0 and d >= 0 and s >= 0:
            out[row] = (1 << d) | (1 << (n_dev + s))
    for row in range(len(out) - 1, 0, -1):
        p = parents[row]
        if p >= 0:
            out[p] |= out[row]
    return out


def device_words(devices: Sequence[str], others: Sequence[Sequence[str]]) -> tuple[str, ...]:
    """The lowest rank's device names as the tree says them for every rank.

    Ranks on their own GPU (``cuda:0`` on rank 0, ``cuda:1`` on rank 1) hold
    the same module on "cuda", not on rank 0's ``cuda:0``.
    """
    if all(list(o) == list(devices) for o in others):
        return tuple(devices)
    return tuple("cuda" if d.startswith("cuda:") else d for d in devices)


def decode(mask: int, states: Sequence[str], devices: Sequence[str]) -> Placement:
    """The ``Placement`` a ``held_masks`` mask stands for, with the shards' state and device names."""
    n_dev = len(devices)
    return Placement(
        states=tuple(s for i, s in enumerate(states) if mask >> (n_dev + i) & 1),
        devices=tuple(dict.fromkeys(d for i, d in enumerate(devices) if mask >> i & 1)),
    )
