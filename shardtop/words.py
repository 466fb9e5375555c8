"""How module paths, lists of names and tables are written for people, in every view and finding."""

from __future__ import annotations

from collections.abc import Collection, Sequence

ROOT_LABEL = "(root)"
"""How the root module (path ``""``) is written for people: not ``model``, which is also the
name of many a LightningModule's attribute."""


def module_label(path: str) -> str:
    """A tree path for people: the root (``""``) is ``(root)``."""
    return path or ROOT_LABEL


def list_names(names: Sequence[str], limit: int = 6) -> str:
    """``a, b, c and 4 more``: a list of names short enough for one sentence."""
    shown = [module_label(n) for n in names[:limit]]
    if not shown:
        return ""
    if len(names) > limit:
        return ", ".join(shown) + f" and {len(names) - limit} more"
    if len(shown) == 1:
        return shown[0]
    return ", ".join(shown[:-1]) + " and " + shown[-1]


def noun(n: int, one: str, many: str | None = None) -> str:
    """The word for ``n`` of a thing: ``rank`` for 1, ``ranks`` (or ``many``) for any other number."""
    return one if n == 1 else many or one + "s"


def plural(n: int, one: str, many: str | None = None) -> str:
    """``1 rank``, ``2 ranks``; ``1 process``, ``3 processes`` with ``many``."""
    return f"{n} {noun(n, one, many)}"


def column_widths(rows: Sequence[Sequence[str]]) -> tuple[int, ...]:
    """Each column's width: that of its widest cell (a header counts as a row)."""
    return tuple(max(len(cell) for cell in column) for column in zip(*rows, strict=True))


def aligned(rows: Sequence[Sequence[str]], right: Collection[int] = ()) -> list[str]:
    """A table as lines of text: each cell padded to its column's width (on the left for the columns in
    ``right``), two spaces between columns, no blanks at the end of a line."""
    widths = column_widths(rows)
    return [
        "  ".join(
            cell.rjust(width) if i in right else cell.ljust(width)
            for i, (cell, width) in enumerate(zip(row, widths, strict=True))
        ).rstrip()
        for row in rows
    ]
