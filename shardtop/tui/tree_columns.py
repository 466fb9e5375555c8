"""The shard tree's columns: how wide each is at a given width, and cells cut to size.

Pure: no Textual, so the layout rules are unit-tested on their own.
"""

from __future__ import annotations

from dataclasses import dataclass

from rich.cells import cell_len

from shardtop.read.shard_model import Figure

OOM_WORDS = "✗ OOM"
"""How the tree marks the module that ran out of memory (the view and the plain first frame alike)."""
NAME_MIN = 24
"""Cells the module names keep before anything else gives way: ``│ │ ├─▶ transformers_out``."""
PARAMS = 6
"""``params`` and ``99.9M``: ``short_count`` is at most 5 cells."""
RANK = 5
"""``r0`` … ``r15`` and ``1.96G``: ``short_bytes`` is at most 5 cells for a size."""
RANGE = 11
"""``1.00M…3.50G``, the one column all ranks fold into when theirs do not fit."""
LAYOUTS = ((16, 13, 10), (12, 13, 10), (12, 13, 0), (10, 13, 0), (10, 0, 0))
"""(type, state, device) widths, widest first; the device goes before the state, the state before a rank."""


FIGURE_WORDS: dict[Figure, str] = {
    "params": "parameter",
    "grads": "gradient",
    "optimizer": "optimizer",
    "activations": "activation",
    "offloaded": "host-offloaded",
    "total": "on-device total",
}
"""What the rank columns count, said in the header: ``gradient bytes →``."""


def module_heading(figure: Figure, width: int) -> str:
    """The header over the module names, saying what the rank columns count:
    ``module      optimizer bytes →``, shorter (``optimizer →``) where that does not fit."""
    words = FIGURE_WORDS[figure]
    for label in (f"{words} bytes per rank →", f"{words} bytes →", f"{words} →"):
        if len("module") + 1 + len(label) <= width:
            return "module" + label.rjust(width - len("module"))
    return "module".ljust(width)


@dataclass(frozen=True)
class TreeColumns:
    """Cell widths of the tree's columns for one widget width."""

    name: int
    type: int
    params: int
    state: int
    device: int
    rank: int
    ranks_shown: int
    """Rank columns drawn one per rank; 0 with ``range`` > 0: one min…max column."""
    range: int


def tree_columns(width: int, nranks: int) -> TreeColumns:
    """Widest layout that leaves the module names ``NAME_MIN`` cells; else the ranks fold into min…max."""
    for type_w, state_w, device_w in LAYOUTS:
        name = width - _fixed(type_w, state_w, device_w) - nranks * (RANK + 1)
        if name >= NAME_MIN:
            return TreeColumns(name, type_w, PARAMS, state_w, device_w, RANK, nranks, 0)
    range_w = RANGE + 1 if nranks else 0
    for type_w, state_w, device_w in LAYOUTS:
        name = width - _fixed(type_w, state_w, device_w) - range_w
        if name >= NAME_MIN:
            return TreeColumns(name, type_w, PARAMS, state_w, device_w, RANK, 0, RANGE if nranks else 0)
    return TreeColumns(max(12, width - _fixed(10, 0, 0) - range_w), 10, PARAMS, 0, 0, RANK, 0, RANGE if nranks else 0)


def _fixed(type_w: int, state_w: int, device_w: int) -> int:
    """Cells of the columns after the name, each with the space before it."""
    return (type_w + 1) + (PARAMS + 1) + (state_w + 1 if state_w else 0) + (device_w + 1 if device_w else 0)


def cut(text: str, width: int) -> str:
    """``text`` left-aligned in exactly ``width`` cells, ending in … when cut."""
    if cell_len(text) <= width:
        return text + " " * (width - cell_len(text))
    return text[: max(0, width - 1)] + "…" if width > 0 else ""
