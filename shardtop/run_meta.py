"""``run.json`` parsed once into a frozen struct: what every view reads about a run.

The launcher, ``shardtop run`` and ranks that create a run themselves write
``run.json`` as a plain JSON object (``RunDirectory.write_meta``).  Readers
never ``meta.get("…")`` it: they parse it here, once, and a field of the
wrong shape reads as missing instead of breaking a view.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any


@dataclass(frozen=True)
class RunMeta:
    """What a run's ``run.json`` says; every field optional, as old and external runs lack some."""

    id: str = ""
    preset: str = ""
    """The preset it runs; empty for a user's own script."""
    program: str = ""
    command: tuple[str, ...] = ()
    created: float | None = None
    host: str = ""
    user: str = ""
    world_size: int = 0
    """Ranks the launcher started (0: not known, e.g. a script's own launcher)."""
    accelerator: str = ""
    memory_limit: int | None = None
    """The per-process cap (``gpu_mem_limit``) the run was given."""
    external: bool = False
    """Created by the ranks of a script rather than by ``shardtop launch``."""
    config: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))
    """The resolved preset configuration, for the report's record."""
    slurm_job_id: str = ""
    """SLURM's job and step where ``shardtop run`` (or the first rank) made the run ("" outside SLURM)."""
    slurm_step_id: str = ""

    @property
    def command_line(self) -> str:
        return shlex.join(self.command)

    @property
    def title(self) -> str:
        """The preset, or what a script run is: ``(own script)``."""
        return self.preset or self.program or "(own script)"

    @classmethod
    def parse(cls, raw: Mapping[str, Any]) -> RunMeta:
        config = raw.get("config")
        config = config if isinstance(config, Mapping) else {}
        slurm = raw.get("slurm")
        slurm = slurm if isinstance(slurm, Mapping) else {}
        command = raw.get("command")
        if isinstance(command, str):
            command_words: tuple[str, ...] = (command,)
        elif isinstance(command, list):
            command_words = tuple(str(c) for c in command)
        else:
            command_words = ()
        return cls(
            id=_text(raw.get("id")),
            preset=_text(raw.get("preset")) if raw.get("preset") not in (None, "?") else "",
            program=_text(config.get("program")),
            command=command_words,
            created=_number(raw.get("created")),
            host=_text(raw.get("host")),
            user=_text(raw.get("user")),
            world_size=_count(config.get("world_size")),
            accelerator=_text(config.get("accelerator")),
            memory_limit=_count(config.get("gpu_mem_limit")) or None,
            external=raw.get("external") is True,
            config=MappingProxyType(dict(config)),
            slurm_job_id=_text(slurm.get("job_id")),
            slurm_step_id=_text(slurm.get("step_id")),
        )


def _text(value: object) -> str:
    return value if isinstance(value, str) else ""


def _number(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value)


def _count(value: object) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0
