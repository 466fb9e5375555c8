"""A report as a few kinds of blocks, and the two ways of printing them.

The post-mortem is written once as blocks (``Heading``, ``Para``, ``Facts``,
``Table``, ``Details``); ``to_text`` lays them out for a terminal and
``to_markdown`` for a GitHub issue (pipe tables, code spans, a collapsed
``<details>`` for tracebacks).  Text inside blocks may use `code spans` and
**bold**: Markdown keeps them, plain text drops the marks.
"""

from __future__ import annotations

import html
import re
from collections.abc import Sequence
from dataclasses import dataclass, field

from shardtop.words import aligned, column_widths


@dataclass(frozen=True)
class Heading:
    text: str
    level: int = 2


@dataclass(frozen=True)
class Para:
    text: str


@dataclass(frozen=True)
class Bullets:
    items: tuple[str, ...]


@dataclass(frozen=True)
class Facts:
    """``key: value`` lines."""

    rows: tuple[tuple[str, str], ...]


@dataclass(frozen=True)
class Table:
    headers: tuple[str, ...]
    rows: tuple[tuple[str, ...], ...]
    right: frozenset[int] = field(default_factory=frozenset)
    """Columns aligned right (numbers)."""
    code: frozenset[int] = field(default_factory=frozenset)
    """Columns shown as code spans in Markdown (tree guides keep their spaces)."""


@dataclass(frozen=True)
class Details:
    """A collapsed block of preformatted lines (tracebacks)."""

    summary: str
    lines: tuple[str, ...]


Block = Heading | Para | Bullets | Facts | Table | Details


# -- plain text ------------------------------------------------------------------------------


def plain(text: str) -> str:
    """Code spans and bold lose their marks on a terminal."""
    return text.replace("`", "").replace("**", "")


def _text_table(table: Table) -> list[str]:
    rows = [[plain(cell) for cell in row] for row in (table.headers, *table.rows)]
    header, *lines = aligned(rows, right=table.right)
    return [header, "  ".join("-" * width for width in column_widths(rows)), *lines]


def to_text(blocks: Sequence[Block]) -> str:
    out: list[str] = []
    for block in blocks:
        if isinstance(block, Heading):
            out.append(block.text)
            if block.level <= 2:
                out.append(("=" if block.level <= 1 else "-") * len(block.text))
        elif isinstance(block, Para):
            out.append(plain(block.text))
        elif isinstance(block, Bullets):
            out.extend(f"  - {plain(item)}" for item in block.items)
        elif isinstance(block, Facts):
            width = max((len(k) for k, _ in block.rows), default=0)
            out.extend(f"{k + ':':<{width + 1}} {plain(v)}" for k, v in block.rows)
        elif isinstance(block, Table):
            out.extend(_text_table(block))
        elif isinstance(block, Details):
            out.append(block.summary + ":")
            out.extend(f"    {line}" for line in block.lines)
        out.append("")
    return "\n".join(out).rstrip() + "\n"


# -- Markdown ------------------------------------------------------------------------------


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _code_cell(text: str) -> str:
    """A code span that keeps the tree guides' spaces; empty cells stay empty."""
    if not text.strip():
        return ""
    return "`" + text.replace("`", "'").replace("|", "¦") + "`"


def _md_table(table: Table) -> list[str]:
    def row(cells: Sequence[str]) -> str:
        shown = [_code_cell(c) if i in table.code else _cell(c) for i, c in enumerate(cells)]
        return "| " + " | ".join(shown) + " |"

    rule = "|" + "|".join("---:" if i in table.right else "---" for i in range(len(table.headers))) + "|"
    return [row(table.headers).replace("`", ""), rule, *(row(r) for r in table.rows)]


def _fence(lines: Sequence[str]) -> str:
    """A code fence longer than any run of backticks inside."""
    longest = max((len(run) for line in lines for run in re.findall(r"`+", line)), default=0)
    return "`" * max(3, longest + 1)


def to_markdown(blocks: Sequence[Block]) -> str:
    out: list[str] = []
    for block in blocks:
        if isinstance(block, Heading):
            out.append("#" * max(1, block.level) + " " + block.text)
        elif isinstance(block, Para):
            out.append(block.text)
        elif isinstance(block, Bullets):
            out.extend(f"- {item}" for item in block.items)
        elif isinstance(block, Facts):
            out.extend(f"- **{k}:** {v}" for k, v in block.rows)
        elif isinstance(block, Table):
            out.extend(_md_table(block))
        elif isinstance(block, Details):
            fence = _fence(block.lines)
            out.append(f"<details><summary>{html.escape(block.summary)}</summary>")
            out.append("")
            out.append(fence + "text")
            out.extend(block.lines)
            out.append(fence)
            out.append("")
            out.append("</details>")
        out.append("")
    return "\n".join(out).rstrip() + "\n"
