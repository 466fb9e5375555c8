"""Which rank of which job this process rehearses, and the environment a rehearsed rank runs in.

A rehearsal runs rank R of a job of N ranks as one process on the one device at
hand.  Its supervisor (``shardtop rehearse``) sets ``SHARDTOP_REHEARSE=R/N``; the
bootstrap of every Python process of the command, and the preset runner, read
it here and put in place the environment a launcher would have given rank R,
as the only process of its node: ``RANK=R``, ``WORLD_SIZE=N``, ``LOCAL_RANK=0``,
``LOCAL_WORLD_SIZE=1``, ``NODE_RANK=R``.  So every engine and script that picks
its device from ``LOCAL_RANK`` picks the one device there is, and every one that
reads its rank from ``RANK`` is rank R.  No torch here: the bootstrap runs it
in launchers too.
"""

from __future__ import annotations

import os

TYPE_CHECKING = False  # the bootstrap imports this in every Python process of the command
if TYPE_CHECKING:
    from collections.abc import Mapping, MutableMapping

REHEARSE_ENV = "SHARDTOP_REHEARSE"
"""``R/N``: this process rehearses rank R of a job of N ranks."""


class Rehearsed:
    """Rank ``rank`` of a job of ``world_size`` ranks, rehearsed alone."""

    __slots__ = ("rank", "world_size")

    def __init__(self, rank: int, world_size: int) -> None:
        self.rank = rank
        self.world_size = world_size

    def __repr__(self) -> str:
        return f"Rehearsed({self.rank}/{self.world_size})"

    @property
    def tag(self) -> str:
        return f"{self.rank}/{self.world_size}"

    def environment(self, port: int = 29500) -> dict[str, str]:
        """What a launcher gives rank R of N when R is the only process of node R (torchrun's names,
        and those of the deepspeed launcher and Lightning that differ)."""
        rank, world = str(self.rank), str(self.world_size)
        return {
            REHEARSE_ENV: self.tag,
            "RANK": rank,
            "WORLD_SIZE": world,
            "LOCAL_RANK": "0",
            "LOCAL_WORLD_SIZE": "1",
            "LOCAL_SIZE": "1",
            "NODE_RANK": rank,
            "GROUP_RANK": rank,
            "ROLE_RANK": rank,
            "ROLE_WORLD_SIZE": world,
            "GROUP_WORLD_SIZE": world,
            "CROSS_RANK": rank,
            "CROSS_SIZE": world,
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
        }


def parse(text: str | None) -> Rehearsed | None:
    """``R/N`` as a rank and a world; None for anything else (the variable unset or garbled)."""
    if not text:
        return None
    rank, _, world = text.partition("/")
    if not (rank.isdigit() and world.isdigit()):
        return None
    r, n = int(rank), int(world)
    return Rehearsed(r, n) if 0 <= r < n else None


def this_process(env: Mapping[str, str] | None = None) -> Rehearsed | None:
    """The rank this process rehearses, if it is part of a rehearsal."""
    return parse((os.environ if env is None else env).get(REHEARSE_ENV))


def reassert(env: MutableMapping[str, str] | None = None) -> Rehearsed | None:
    """Put the rehearsed rank's environment back in place (a launcher has just set its own), keeping
    the port a launcher chose; returns the rank, or None outside a rehearsal."""
    env = os.environ if env is None else env
    rehearsed = this_process(env)
    if rehearsed is not None:
        port = env.get("MASTER_PORT", "")
        env.update(rehearsed.environment(int(port) if port.isdigit() else 29500))
    return rehearsed


def first_gpu(env: Mapping[str, str]) -> str:
    """``CUDA_VISIBLE_DEVICES`` for a rehearsal: only the first GPU the user lets it see."""
    visible = env.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        return "0"
    return visible.split(",")[0].strip()
