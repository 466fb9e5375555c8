"""``Finding``: one diagnosis, in the user's words, with the numbers behind it."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field


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


SEVERITIES = ("error", "warning", "info")
"""Most severe first: ``error`` explains a failure (an OOM), ``warning`` wastes memory or
risks the training, ``info`` is worth knowing."""


def severity_key(finding: Finding) -> tuple[int, int]:
    """Sort key: severity, then the larger saving first."""
    rank = SEVERITIES.index(finding.severity) if finding.severity in SEVERITIES else len(SEVERITIES)
    return rank, -(finding.saving_bytes or 0)
