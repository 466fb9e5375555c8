"""Reading Prometheus's text exposition format back, as a scraper reads it, to check what an export says.

From the format's description ("Exposition formats", text format 0.0.4): a line is a comment (``#``), or
``name{label="value",...} value [timestamp]``; label values escape backslash, double quote and newline.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

NAME = r"[a-zA-Z_:][a-zA-Z0-9_:]*"
SAMPLE = re.compile(rf"^(?P<name>{NAME})(?:\{{(?P<labels>.*)\}})? (?P<value>\S+)(?: (?P<timestamp>-?\d+))?$")
LABEL = re.compile(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"\s*(?:,|$)')
ESCAPES = {"\\\\": "\\", '\\"': '"', "\\n": "\n"}


@dataclass(frozen=True)
class Series:
    name: str
    labels: dict[str, str]
    value: float
    timestamp: str | None


def _unescape(value: str) -> str:
    return re.sub(r"\\[\\\"n]", lambda m: ESCAPES[m.group(0)], value)


def parse(text: str) -> list[Series]:
    """Every sample line of ``text``; AssertionError on a line that is neither a sample nor a comment."""
    found = []
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = SAMPLE.match(line)
        assert m is not None, f"not a sample line: {line!r}"
        pairs = LABEL.findall(m.group("labels") or "")
        assert "".join(f'{k}="{v}",' for k, v in pairs).rstrip(",") == (m.group("labels") or "").strip(), line
        found.append(Series(m.group("name"), {k: _unescape(v) for k, v in pairs}, float(m.group("value")),
                            m.group("timestamp")))
    return found


def values(series: list[Series], name: str, **wanted: object) -> list[float]:
    """The values of ``name``'s series whose labels include ``wanted``."""
    return [s.value for s in series
            if s.name == name and all(s.labels.get(k) == str(v) for k, v in wanted.items())]


def value(series: list[Series], name: str, **wanted: object) -> float | None:
    """The one value of ``name`` with labels ``wanted``; None where there is no such series."""
    found = values(series, name, **wanted)
    assert len(found) <= 1, (name, wanted, found)
    return found[0] if found else None
