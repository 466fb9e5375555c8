"""Where a preset's program runs: its run directory, rank, world size, device and config."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class RankContext:
    """What a program needs to know about where it runs."""

    run_dir: Path
    rank: int
    world_size: int
    accelerator: str
    """cpu or cuda."""
    config: dict[str, Any]

    @property
    def local_rank(self) -> int:
        return int(os.environ.get("LOCAL_RANK", self.rank))

    @property
    def device(self) -> str:
        return f"cuda:{self.local_rank}" if self.accelerator == "cuda" else "cpu"
