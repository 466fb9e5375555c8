"""Where a preset's program runs: its run directory, rank, world size, device and config."""

from __future__ import annotations

import os
from collections.abc import Mapping
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
    config: Mapping[str, Any]
    """The run's configuration as written: the preset's own keys (``model``, ``batch_size``...)."""
    gpu_mem_limit: int | None = None
    """The per-process memory cap in bytes, if the run has one."""

    @property
    def local_rank(self) -> int:
        return int(os.environ.get("LOCAL_RANK", self.rank))

    @property
    def device(self) -> str:
        return f"cuda:{self.local_rank}" if self.accelerator == "cuda" else "cpu"
