"""Prometheus's text exposition format (version 0.0.4): what a scrape and node_exporter's textfile read.

Every family is a gauge, written as ``# HELP``, ``# TYPE`` and its samples, one family after another,
each series once (a scrape with a series twice is refused whole).  No timestamps: the scraper stamps
each sample, and node_exporter's textfile collector refuses files that carry them.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

METRIC_NAME = re.compile(r"^[a-zA-Z_:][a-zA-Z0-9_:]*$")
LABEL_NAME = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")


@dataclass(frozen=True)
class Gauge:
    """One metric family: its name and what its HELP line says."""

    name: str
    help: str

    def __post_init__(self) -> None:
        if not METRIC_NAME.match(self.name):
            raise ValueError(f"{self.name!r} is not a metric name")


Labels = tuple[tuple[str, str], ...]


@dataclass(frozen=True)
class Sample:
    """One series of a gauge at this scrape."""

    gauge: Gauge
    labels: Labels
    value: float


def labels(**given: object) -> Labels:
    """Label pairs in the order given; a label whose value is None or "" is left out (Prometheus reads an
    empty label as an absent one)."""
    pairs = tuple((name, str(value)) for name, value in given.items() if value is not None and value != "")
    for name, _ in pairs:
        if not LABEL_NAME.match(name) or name.startswith("__"):
            raise ValueError(f"{name!r} is not a label name")
    return pairs


def sample(gauge: Gauge, value: float | None, base: Labels = (), **more: object) -> Sample | None:
    """A sample of ``gauge``, or None where the value is not known (no series, rather than a made-up 0)."""
    if value is None:
        return None
    return Sample(gauge, base + labels(**more), float(value))


def _escape_label(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _escape_help(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\n", "\\n")


def format_value(value: float) -> str:
    """``12``, ``0.25``, ``NaN``, ``+Inf``: integers without a fraction (bytes stay exact)."""
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    if value.is_integer() and abs(value) < 2**63:
        return str(int(value))
    return repr(value)


def _series(s: Sample) -> str:
    if not s.labels:
        return f"{s.gauge.name} {format_value(s.value)}"
    inside = ",".join(f'{name}="{_escape_label(value)}"' for name, value in s.labels)
    return f"{s.gauge.name}{{{inside}}} {format_value(s.value)}"


def render(samples: Iterable[Sample | None]) -> str:
    """The exposition text: each gauge's HELP and TYPE, then its samples, in the order gauges first appear.

    A series given twice (same gauge and labels) is written once, the first time.
    """
    by_gauge: dict[str, tuple[Gauge, dict[Labels, Sample]]] = {}
    for s in samples:
        if s is None:
            continue
        gauge, series = by_gauge.setdefault(s.gauge.name, (s.gauge, {}))
        series.setdefault(s.labels, s)
    lines: list[str] = []
    for gauge, series in by_gauge.values():
        lines.append(f"# HELP {gauge.name} {_escape_help(gauge.help)}")
        lines.append(f"# TYPE {gauge.name} gauge")
        lines.extend(_series(s) for s in series.values())
    return "".join(line + "\n" for line in lines)


def states(gauge: Gauge, known: Iterable[str], now: str, base: Labels, label: str) -> list[Sample | None]:
    """A state as Prometheus keeps an enumeration: one series per known value, 1 for ``now`` and 0 for the
    others (``now`` added when it is not among them; nothing is 1 when ``now`` is "")."""
    values = list(dict.fromkeys(known))
    if now and now not in values:
        values.append(now)
    return [sample(gauge, 1 if value == now else 0, base, **{label: value}) for value in values]


def counts(
    gauge: Gauge, known: Iterable[str], found: Mapping[str, int], base: Labels, label: str
) -> list[Sample | None]:
    """How many of each ``known`` value were found (0 for none), as one series per value."""
    return [sample(gauge, found.get(value, 0), base, **{label: value}) for value in known]
