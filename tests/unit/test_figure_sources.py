"""Every figure the README and ``docs/`` state has a source in ``docs/figures.yaml``, and each source holds it.

A figure is a number with a unit: bytes (``17.6 GiB``, ``8,456,457,728 B``, ``18 bytes``), a time
(``141 s``, ``2.5 ms``, ``13 to 16 minutes``), a share (``within 6 %``) or a ratio (``1.02x``).  Numbers
given to a command (``gpu_mem_limit=15GiB``) are what a user types, not figures.  Each figure, in its
paragraph (a table's row, a list's item), must match an entry: the same document, the figure as written,
and, where the entry names one, a phrase of that paragraph.  Each entry names a source that exists
(a benchmark's entry in ``bench/RESULTS.md``, a test, a recording, or the code that sets a default) and,
where it says what the source shows, the source says it.  An entry that matches no figure any more fails
too: the file says where today's figures come from, not yesterday's.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import pytest
import yaml

from tests.support.cli import ROOT

SOURCES = ROOT / "docs" / "figures.yaml"
KINDS = frozenset({"benchmark", "test", "recording", "setting"})

_NUMBER = r"\d[\d,]*(?:\.\d+)?"
_UNIT = (
    r"(?:[KMGTP]i?B(?:/s|/step)?|kB|B|bytes?|µs|ms|s|min|minutes?|seconds?|hours?|%"
    r"|(?<=\d)[x×](?!\d))"
)
FIGURE = re.compile(
    rf"(?<![\w.,/=+\-])(?:[±+−]\s?)?{_NUMBER}(?:\s?(?:[–-]|to)\s?(?:[+−]\s?)?{_NUMBER})?[\s\u00a0]?{_UNIT}(?![\w])"
)
"""A figure as the documents write it: a number (a range: ``10–12 s``, ``13 to 16 minutes``) and its unit."""


@dataclass(frozen=True)
class Occurrence:
    doc: str
    figure: str
    context: str
    """The paragraph, table row or list item the figure stands in, its white space made single spaces."""


@dataclass(frozen=True)
class Entry:
    doc: str
    figures: tuple[str, ...]
    kind: str
    source: str
    near: str = ""
    shows: tuple[str, ...] = ()
    says: str = ""

    @property
    def name(self) -> str:
        near = f" near {self.near!r}" if self.near else ""
        return f"{self.doc}: {', '.join(self.figures)}{near} <- {self.source}"


def _flat(text: str) -> str:
    return re.sub(r"\s+", " ", text.replace("\u00a0", " ")).strip()


def documents() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def contexts(text: str) -> Iterator[str]:
    """Paragraphs: blocks between blank lines; a fenced code block is one; each table row and list item alone."""
    block: list[str] = []
    fenced = False
    for line in [*text.splitlines(), ""]:
        if line.startswith("```"):
            fenced = not fenced
        if not fenced and (not line.strip() or line.lstrip().startswith(("|", "- ", "* "))):
            if block:
                yield _flat("\n".join(block))
            block = [line] if line.strip() else []
            if line.lstrip().startswith("|"):
                yield _flat(line)
                block = []
            continue
        block.append(line)


def occurrences() -> list[Occurrence]:
    found = []
    for path in documents():
        doc = path.relative_to(ROOT).as_posix()
        for context in contexts(path.read_text()):
            found += [Occurrence(doc, _flat(m.group()), context) for m in FIGURE.finditer(context)]
    return found


@cache
def entries() -> tuple[Entry, ...]:
    data = yaml.safe_load(SOURCES.read_text())
    made = []
    for raw in data["figures"]:
        shows = raw.get("shows", ())
        made.append(Entry(doc=raw["doc"], figures=tuple(raw["figures"]), kind=raw["kind"], source=raw["source"],
                          near=raw.get("near", ""), shows=(shows,) if isinstance(shows, str) else tuple(shows),
                          says=raw.get("says", "")))
    return tuple(made)


def matches(entry: Entry, occurrence: Occurrence) -> bool:
    return (entry.doc == occurrence.doc and occurrence.figure in entry.figures
            and _flat(entry.near) in occurrence.context)


def test_the_figure_finder_reads_figures_as_the_documents_write_them() -> None:
    text = ("peaks at 8,456,457,216 B, −5.1 % low; 13 to 16 minutes, 10–12 s; a ratio of 1.02x; "
            "`gpu_mem_limit=15GiB` on 80×24; 4 bytes a parameter, 250 MiB/step")
    assert [_flat(m.group()) for m in FIGURE.finditer(text)] == [
        "8,456,457,216 B", "−5.1 %", "13 to 16 minutes", "10–12 s", "1.02x", "4 bytes", "250 MiB/step"]


def test_every_figure_in_the_readme_and_docs_has_a_source() -> None:
    unsourced = [o for o in occurrences() if not any(matches(e, o) for e in entries())]
    assert not unsourced, "figures without an entry in docs/figures.yaml:\n" + "\n".join(
        f"  {o.doc}: {o.figure!r} in: {o.context[:160]}" for o in unsourced)


def test_every_entry_still_sources_a_figure() -> None:
    found = occurrences()
    stale = [e.name for e in entries() if not any(matches(e, o) for o in found)]
    assert not stale, "entries in docs/figures.yaml that match no figure any more:\n" + "\n".join(stale)


@pytest.mark.parametrize("entry", entries(), ids=lambda e: e.name[:90])
def test_each_source_exists_and_shows_what_its_entry_says(entry: Entry) -> None:
    assert entry.kind in KINDS, f"{entry.name}: kind {entry.kind!r} is not one of {sorted(KINDS)}"
    source = ROOT / entry.source
    assert source.exists(), f"{entry.name}: {entry.source} does not exist"
    if entry.kind == "benchmark":
        assert entry.source.startswith("bench/"), f"{entry.name}: a benchmark's figure is cited from bench/"
    for shown in entry.shows:
        assert source.is_file(), f"{entry.name}: what a source shows is looked for in a file"
        assert _flat(shown) in _flat(source.read_text()), f"{entry.name}: {entry.source} does not say {shown!r}"
