"""Where a module's parameters are, over every rank: the states and devices of its subtree as bit masks.

Pure Python, no Textual: the shard model computes the masks once per build, and
the tree, the details pane and the report read one ``Placement`` per line they
draw.  One policy for every view: a module is in every state and on every
device any rank holds its subtree's parameters in, and ranks on their own GPU
(``cuda:0`` on rank 0, ``cuda:1`` on rank 1) hold it on ``cuda``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from shardtop.rundir.events import Shards


@dataclass(frozen=True)
class Placement:
    """The states and devices a module's parameters (its descendants' too) are held in."""

    states: tuple[str, ...]
    devices: tuple[str, ...]

    @property
    def state(self) -> str:
        """``offloaded``; ``sharded+unsharded`` over two states; ``mixed`` over more; empty with no parameters."""
        return _words(self.states)

    @property
    def device(self) -> str:
        """``cuda:0``; ``cpu+cuda:0`` over two devices; ``mixed`` over more."""
        return _words(self.devices)


def _words(names: tuple[str, ...]) -> str:
    return "+".join(names) if len(names) <= 2 else "mixed"


def device_words(per_rank: Sequence[Sequence[str]]) -> list[list[str]]:
    """Each rank's device names as the tree says them: ``cuda`` where ranks sit on different GPUs."""
    first = list(per_rank[0]) if per_rank else []
    if all(list(d) == first for d in per_rank):
        return [list(d) for d in per_rank]
    return [["cuda" if name.startswith("cuda:") else name for name in d] for d in per_rank]


@dataclass(frozen=True)
class PlacementMasks:
    """Per tree row, a bit mask of its subtree's placement over every rank.

    Bit ``d`` is ``devices[d]``, bit ``len(devices) + s`` is ``states[s]``.
    """

    masks: tuple[int, ...]
    states: tuple[str, ...]
    devices: tuple[str, ...]

    def placement(self, rows: Sequence[int]) -> Placement:
        mask = 0
        for row in rows:
            mask |= self.masks[row]
        n_dev = len(self.devices)
        return Placement(
            states=tuple(s for i, s in enumerate(self.states) if mask >> (n_dev + i) & 1),
            devices=tuple(dict.fromkeys(d for i, d in enumerate(self.devices) if mask >> i & 1)),
        )


def placement_masks(shards: Mapping[int, Shards], parents: Sequence[int], params: Sequence[int]) -> PlacementMasks:
    """One pass per distinct rank layout and one up the tree: ranks that hold the model the same
    way (the usual case) cost one pass together, so 512 ranks of one layout cost what one does."""
    ranks = sorted(shards)
    words = device_words([shards[r].devices for r in ranks])
    states: dict[str, int] = {}
    devices: dict[str, int] = {}
    layouts: dict[tuple[tuple[str, ...], tuple[str, ...], tuple[int, ...], tuple[int, ...]], None] = {}
    for rank, dev_names in zip(ranks, words, strict=True):
        s = shards[rank]
        layouts[(tuple(dev_names), tuple(s.states), tuple(s.device), tuple(s.state))] = None
        for name in s.states:
            states.setdefault(name, len(states))
        for name in dev_names:
            devices.setdefault(name, len(devices))
    n_dev = len(devices)
    out = [0] * len(parents)
    for layout_devices, state_names, device, state in layouts:
        dbits = [1 << devices[name] for name in layout_devices]
        sbits = [1 << (n_dev + states[name]) for name in state_names]
        for row, (d, st) in enumerate(zip(device, state, strict=True)):
            if params[row] > 0 and 0 <= d < len(dbits) and 0 <= st < len(sbits):
                out[row] |= dbits[d] | sbits[st]
    for row in range(len(out) - 1, 0, -1):
        p = parents[row]
        if p >= 0:
            out[p] |= out[row]
    return PlacementMasks(tuple(out), tuple(states), tuple(devices))
