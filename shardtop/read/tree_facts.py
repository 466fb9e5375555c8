"""Facts about a model's structure that do not depend on how it is sharded.

``find_block`` names the repeated module an auto-wrap policy should name;
``covering_rows`` turns a selection of rows into the outermost modules that
hold it ("conv1, bn1 and conv_out" rather than their parameters).  Pure
Python, linear in the number of modules.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from shardtop.rundir.events import Tree

CONTAINER_TYPES = frozenset({"Sequential", "ModuleList", "ModuleDict", "ParameterList", "ParameterDict"})
"""Modules that only hold others: never the block a wrap policy should name."""

BLOCK_MIN_SHARE = 0.5
"""A repeated module type with children is "the block" when its instances hold at least
half of the parameter bytes (a transformer layer holds nearly all of them); otherwise the
most repeated leaf type (``Linear`` in story 2) stands in."""


def covering_rows(selected: Sequence[bool], has_params: Sequence[bool], parents: Sequence[int]) -> list[int]:
    """Highest rows whose every parameter-holding descendant (and self) is selected.

    Used to say "conv1, bn1, conv_out" instead of listing their parameters:
    a row qualifies when its subtree holds parameters and all of them are
    ``selected``; only the outermost qualifying rows are returned.
    """
    n = len(parents)
    any_sel = [selected[i] and has_params[i] for i in range(n)]
    any_unsel = [has_params[i] and not selected[i] for i in range(n)]
    for i in range(n - 1, 0, -1):
        p = parents[i]
        if p >= 0:
            any_sel[p] = any_sel[p] or any_sel[i]
            any_unsel[p] = any_unsel[p] or any_unsel[i]
    out = []
    for i in range(n):
        if not any_sel[i] or any_unsel[i]:
            continue
        p = parents[i]
        if p >= 0 and any_sel[p] and not any_unsel[p]:
            continue
        out.append(i)
    return out


@dataclass(frozen=True)
class Block:
    """The repeated module an auto-wrap policy should name."""

    type_name: str
    count: int
    largest_bytes: int
    """Full bytes of the largest instance (its subtree)."""
    total_bytes: int
    container: str
    """Path of the first instance's parent, e.g. ``net`` or ``model.blocks``."""
    has_children: bool


def find_block(tree: Tree, paths: Sequence[str], subtree_bytes: Sequence[int]) -> Block | None:
    """The most repeated module type that holds the parameters (see ``BLOCK_MIN_SHARE``)."""
    n = len(tree.names)
    has_kids = [False] * n
    for row in range(1, n):
        p = tree.parents[row]
        if p >= 0:
            has_kids[p] = True
    stats: dict[int, list[int]] = {}  # type -> [count, total, largest, first row]
    for row in range(1, n):
        size = subtree_bytes[row]
        t = tree.types[row]
        if size <= 0 or tree.type_names[t] in CONTAINER_TYPES:
            continue
        s = stats.get(t)
        if s is None:
            stats[t] = [1, size, size, row]
        else:
            s[0] += 1
            s[1] += size
            s[2] = max(s[2], size)
    repeated = {t: s for t, s in stats.items() if s[0] >= 2}
    if not repeated:
        return None
    full = max(subtree_bytes[0], 1)
    first_with_kids: dict[int, bool] = {t: has_kids[s[3]] for t, s in repeated.items()}
    parents_blocks = {t: s for t, s in repeated.items() if first_with_kids[t] and s[1] >= BLOCK_MIN_SHARE * full}
    pool = parents_blocks or {t: s for t, s in repeated.items() if not first_with_kids[t]} or repeated
    t, s = max(pool.items(), key=lambda item: (item[1][1], item[1][0]))
    parent = tree.parents[s[3]]
    return Block(
        type_name=tree.type_names[t],
        count=s[0],
        largest_bytes=s[2],
        total_bytes=s[1],
        container=paths[parent] if parent >= 0 else "",
        has_children=first_with_kids[t],
    )
