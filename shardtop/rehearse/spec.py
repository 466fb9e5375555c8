"""What a rehearsal was asked for: which worlds, which ranks; parsed once, checked, no I/O.

``devices=N`` (or ``devices=2,4,8``, one rehearsal per world) is the size of the
job rehearsed; ``rank=R`` a rank of it, ``last`` (the rank that holds the
uneven last shard), ``all``, or a list (``rank=0,last``); rank 0 by default.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal, get_args

from shardtop.config import ConfigError

MAX_WORLD = 1 << 20
"""The largest world a rehearsal takes (no job has a million ranks)."""
RankWord = Literal["last", "all"]
"""``last``: the rank that holds the uneven last shard; ``all``: every rank of the job."""
RANK_WORDS: tuple[RankWord, ...] = get_args(RankWord)
AskedRank = int | RankWord
"""A rank as ``rank=`` names it: its number, or a word."""


@dataclass(frozen=True)
class RehearsalSpec:
    worlds: tuple[int, ...]
    """The job sizes to rehearse, in the order asked."""
    ranks: tuple[AskedRank, ...] = (0,)
    """Rank numbers, ``last`` or ``all``, as asked."""

    def ranks_of(self, world: int) -> tuple[int, ...]:
        """The ranks rehearsed in a job of ``world`` ranks, each once, in the order asked."""
        chosen: list[int] = []
        for asked in self.ranks:
            if asked == "all":
                wanted: Iterable[int] = range(world)
            elif asked == "last":
                wanted = (world - 1,)
            else:
                if asked >= world:
                    raise ConfigError(
                        f"rank={asked}: a job of devices={world} has ranks 0 to {world - 1}; "
                        f"e.g. rank=0 or rank=last."
                    )
                wanted = (asked,)
            chosen.extend(r for r in wanted if r not in chosen)
        return tuple(chosen)


def _worlds(text: str) -> tuple[int, ...]:
    worlds: list[int] = []
    for part in text.split(","):
        part = part.strip()
        if not part.isdigit() or not 1 <= int(part) <= MAX_WORLD:
            raise ConfigError(
                f"devices={text}: expected the number of GPUs of the job to rehearse, or several, "
                f"e.g. devices=8 or devices=2,4,8."
            )
        if int(part) not in worlds:
            worlds.append(int(part))
    return tuple(worlds)


def _ranks(text: str) -> tuple[AskedRank, ...]:
    ranks: list[AskedRank] = []
    for part in text.split(","):
        part = part.strip().lower()
        word = next((w for w in RANK_WORDS if w == part), None)
        if word is not None:
            ranks.append(word)
        elif part.isdigit() and int(part) < MAX_WORLD:
            ranks.append(int(part))
        else:
            raise ConfigError(
                f"rank={text}: expected a rank number, last, all, or a list of them, e.g. rank=0,last."
            )
    return tuple(ranks)


def parse_settings(settings: Iterable[str]) -> tuple[RehearsalSpec, list[str]]:
    """``devices=`` and ``rank=`` taken out of the settings; the rest (preset and keys) as they came."""
    worlds: tuple[int, ...] | None = None
    ranks: tuple[AskedRank, ...] = (0,)
    rest: list[str] = []
    for arg in settings:
        key, eq, value = arg.partition("=")
        if eq and key.strip() == "devices":
            worlds = _worlds(value)
        elif eq and key.strip() == "rank":
            ranks = _ranks(value)
        else:
            rest.append(arg)
    if worlds is None:
        raise ConfigError(
            "how many GPUs has the job to rehearse? e.g. shardtop rehearse zero3-linear devices=6, "
            "or shardtop rehearse devices=8 -- torchrun --nproc_per_node 8 train.py"
        )
    spec = RehearsalSpec(worlds=worlds, ranks=ranks)
    for world in worlds:
        spec.ranks_of(world)  # a rank beyond a world is refused before anything starts
    return spec, rest
