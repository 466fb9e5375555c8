"""Rules that turn a run's shard tree, memory and OOM into plain-language findings.

Pure Python over a ``RunState``: the TUI, ``shardtop report`` and tests all
call ``diagnose(state)``.  Each finding has a stable ``code``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from shardtop.run_state import RunState


@dataclass(frozen=True)
class Finding:
    code: str
    """Stable identifier, e.g. ``zero3-not-partitioned-at-init``."""
    title: str
    detail: str
    """What happened, with the numbers that show it."""
    fix: str
    """What to change, in the user's terms."""
    severity: str = "warning"
    """error (explains a failure), warning, or info."""
    saving_bytes: int | None = None
    """Estimated bytes saved per rank by the fix."""
    modules: tuple[str, ...] = ()
    """Tree paths the finding concerns (empty: the whole run)."""
    evidence: Mapping[str, int | float | str] = field(default_factory=dict)


def diagnose(state: RunState) -> list[Finding]:
    """Every finding the run's events support, most severe first."""
    return []
