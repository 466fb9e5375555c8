"""Bytes and counts for people: one place, used by the diagnosis, the report, the TUI and the CLI.

Pure Python with no imports of the project, so the diagnosis can word a number
without importing the launcher's configuration.
"""

from __future__ import annotations

GiB = 1 << 30
MiB = 1 << 20


def ceil_div(n: int, d: int) -> int:
    """``n / d`` rounded up: what the fullest of ``d`` ranks holds of ``n`` elements (``ceil_div(10, 4) == 3``),
    or how many blocks of ``d`` bytes hold ``n``."""
    return -(-n // d)


def format_bytes(n: int | float | None) -> str:
    """``1.96 GiB``, ``512 MiB``, ``3 B``: for people, not for parsing; ``?`` when unknown."""
    if n is None:
        return "?"
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(size) < 1024 or unit == "TiB":
            if unit == "B":
                return f"{int(size)} B"
            return f"{size:.3g} {unit}" if abs(size) < 100 else f"{size:.0f} {unit}"
        size /= 1024
    return f"{size:.1f} TiB"  # pragma: no cover


def short_bytes(n: int | float | None) -> str:
    """At most 6 cells: ``1.96G``, ``512M``, ``3.0K``, ``17B``, ``0``; ``-`` for unknown."""
    if n is None:
        return "-"
    if n == 0:
        return "0"
    size = float(n)
    for unit in ("B", "K", "M", "G", "T"):
        if abs(size) < 1000 or unit == "T":
            if unit == "B":
                return f"{int(size)}B"
            return (
                f"{size:.2f}{unit}"
                if abs(size) < 10
                else f"{size:.1f}{unit}"
                if abs(size) < 100
                else f"{size:.0f}{unit}"
            )
        size /= 1024
    return f"{size:.0f}T"  # pragma: no cover


def count_words(n: int) -> str:
    """Parameter counts in a few characters: ``262 K``, ``25.2 M``, ``1.3 B``."""
    value = float(n)
    for unit in ("", " K", " M", " B"):
        if abs(value) < 1000:
            return f"{int(value)}" if not unit else f"{value:.3g}{unit}"
        value /= 1000
    return f"{value:.3g} T"


def times(ratio: float) -> str:
    """A ratio for a sentence: ``1.8×``, ``12×``, ``over 100×``."""
    return "over 100×" if ratio > 100 else f"{ratio:.0f}×" if ratio >= 10 else f"{ratio:.1f}×"


def share(part: int | float, whole: int | float) -> str:
    """``42 %`` of ``whole``; ``-`` when there is no whole."""
    return f"{100 * part / whole:.0f} %" if whole else "-"
