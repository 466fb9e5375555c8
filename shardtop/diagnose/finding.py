"""``Finding``: one diagnosis, in the user's words, rendered from the evidence that made it.

A rule is its finding's code and two functions (``Rule``): ``find`` reads the
run's ``RunModel`` and returns typed evidence — numbers, modules, engine
facts, the samples used — or None; ``explain`` turns that evidence, and
nothing else, into the finding's words (``Explanation``).  The rule joins
code, words and evidence into a ``Finding``, so every word a finding says can
be checked against its evidence, which the JSON report carries whole.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, Literal, TypeVar

from shardtop.rundir.json_files import JsonObject

Severity = Literal["error", "warning", "info"]

SEVERITIES: tuple[Severity, ...] = ("error", "warning", "info")
"""Most severe first: ``error`` explains a failure (an OOM), ``warning`` wastes memory or
risks the training, ``info`` is worth knowing."""


@dataclass(frozen=True)
class Evidence:
    """What a rule saw.  Each rule subclasses it with the fields its words need."""

    def as_dict(self) -> JsonObject:
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class Explanation:
    """What a finding says, in the user's words: written by a rule's ``explain`` from its evidence alone."""

    title: str
    detail: str
    """What happened, with the numbers that show it."""
    fix: str
    """What to change, in the user's terms."""
    severity: Severity = "warning"
    saving_bytes: int | None = None
    """Estimated bytes saved per rank by the fix."""
    modules: tuple[str, ...] = ()
    """Tree paths the finding concerns (empty: the whole run)."""


@dataclass(frozen=True)
class Finding:
    code: str
    """Stable identifier, e.g. ``zero3-not-partitioned-at-init``."""
    title: str
    detail: str
    """What happened, with the numbers that show it."""
    fix: str
    """What to change, in the user's terms."""
    evidence: Evidence
    severity: Severity = "warning"
    saving_bytes: int | None = None
    """Estimated bytes saved per rank by the fix."""
    modules: tuple[str, ...] = ()
    """Tree paths the finding concerns (empty: the whole run)."""


E = TypeVar("E", bound=Evidence)


@dataclass(frozen=True)
class Rule(Generic[E]):
    """A rule: evidence from the run, then words from the evidence."""

    code: str
    """The code of the findings it makes."""
    find: Callable[[Any], E | None]
    """``RunModel`` → evidence, or None when the run does not show it."""
    explain: Callable[[E], Explanation]

    def apply(self, model: Any) -> Finding | None:
        """The rule's finding on ``model`` (a ``RunModel``), or None when the run does not show it."""
        evidence = self.find(model)
        if evidence is None:
            return None
        words = self.explain(evidence)
        return Finding(
            code=self.code, title=words.title, detail=words.detail, fix=words.fix, evidence=evidence,
            severity=words.severity, saving_bytes=words.saving_bytes, modules=words.modules,
        )


def severity_key(finding: Finding) -> tuple[int, int]:
    """Sort key: severity, then the larger saving first."""
    rank = SEVERITIES.index(finding.severity) if finding.severity in SEVERITIES else len(SEVERITIES)
    return rank, -(finding.saving_bytes or 0)
