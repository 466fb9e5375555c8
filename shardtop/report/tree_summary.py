"""The shard tree, summarised for a report: top levels, repeated siblings folded.

Folding and the visible lines are the TUI's (``shardtop.read.shard_model`` and
``shardtop.read.tree_lines``: pure Python, no Textual); this module only
chooses what is open — a few levels, plus the way to the OOM's module — and
turns each visible line into a row of numbers and words.
"""

from __future__ import annotations

from dataclasses import dataclass

from shardtop.read.shard_model import Fold, Node, ShardModel
from shardtop.read.tree_lines import Line, visible_lines
from shardtop.words import ROOT_LABEL

TREE_DEPTH = 2
"""Levels open from the root: the root and its children, so ``model → net → 18000 × Linear``
and ``model → transformer_0 → its blocks`` show; deeper levels stay inside their parent's sums."""

TREE_MAX_ROWS = 60
"""Rows a report shows at most; a pasted issue beyond that is unread.  ``shardtop attach`` shows all."""


@dataclass(frozen=True)
class TreeRow:
    """One line of the summary."""

    guide: str
    label: str
    """A module's name (``model`` for the root), or a fold's ``net.0 … net.17999``."""
    type: str
    """The module type, or ``18000 × Linear`` for a fold."""
    params: int
    """Parameters of the subtree(s), full size."""
    full_bytes: int
    rank_bytes: tuple[int, ...]
    """Bytes of the subtree(s) stored on each rank of ``ranks``."""
    state: str
    device: str
    note: str
    path: str
    """The module's tree path (a fold: its first member's)."""
    count: int = 1


@dataclass(frozen=True)
class TreeSummary:
    rows: tuple[TreeRow, ...]
    ranks: tuple[int, ...]
    hidden: int
    """Visible lines left out to keep the summary short."""
    modules: int
    stage: str
    """Which snapshot the bytes come from: setup, engine or step (the lowest rank's)."""


def _depths(model: ShardModel) -> list[int]:
    parents = model.tree.parents
    depth = [0] * model.size
    for row in range(1, model.size):
        p = parents[row]
        depth[row] = depth[p] + 1 if p >= 0 else 0
    return depth


def opened(model: ShardModel, culprit: str | None, depth: int = TREE_DEPTH) -> set[Node]:
    """Modules open in the summary: the first ``depth`` levels and the ancestors of the culprit.

    Folds stay shut (18000 rows would drown the report); a fold holding the
    culprit says so in its note instead.
    """
    depths = _depths(model)
    out: set[Node] = {row for row in range(model.size) if depths[row] < depth and model.kids_of(row)}
    row = model.row_of(culprit) if culprit is not None else None
    if row is not None:
        out.update(model.ancestors(row))
    return out


def _row(model: ShardModel, line: Line, culprit_row: int | None) -> TreeRow:
    node = line.node
    tree = model.tree
    if isinstance(node, Fold):
        members = model.members(node)
        first = members[0]
        label = f"{model.paths[first]} … {model.paths[members[-1]]}"
        kind = f"{len(members)} × {model.type_of(first)}"
        units = sum(1 for m in members if m in model.unit_roots)
        note = ""
        if culprit_row is not None and model.fold_containing(culprit_row) == node:
            note = f"✗ OOM in {model.paths[culprit_row]}"
        elif units:
            note = f"{units} {model.unit_roots[first].kind} units" if first in model.unit_roots else f"{units} units"
    else:
        members, first = (node,), node
        label = model.name_of(node) if node else ROOT_LABEL
        kind = tree.type_names[tree.types[node]]
        unit = model.unit_roots.get(node)
        note = "✗ OOM" if node == culprit_row else (f"{unit.kind} unit" if unit is not None else "")
    placed = model.placement(node)
    return TreeRow(
        guide=line.guide,
        label=label,
        type=kind,
        params=model.node_params(node),
        full_bytes=model.node_full_bytes(node),
        rank_bytes=tuple(model.node_bytes(node, r) for r in model.ranks),
        state=placed.state,
        device=placed.device,
        note=note,
        path=model.paths[first],
        count=len(members),
    )


def summarize_tree(
    model: ShardModel, culprit: str | None = None, depth: int = TREE_DEPTH, max_rows: int = TREE_MAX_ROWS
) -> TreeSummary:
    """The rows a report shows, at most ``max_rows`` (the culprit's line always among them)."""
    lines = visible_lines(model, opened(model, culprit, depth))
    culprit_row = model.row_of(culprit) if culprit is not None else None
    keep = lines[:max_rows]
    hidden = len(lines) - len(keep)
    if hidden and culprit_row is not None:
        target = model.fold_containing(culprit_row) or culprit_row
        at = next((i for i, line in enumerate(lines) if line.node == target), None)
        if at is not None and at >= max_rows:
            keep = lines[: max_rows - 1] + [lines[at]]
    stage = ""
    if model.ranks:
        stage = model.shards[model.ranks[0]].stage
    return TreeSummary(
        rows=tuple(_row(model, line, culprit_row) for line in keep),
        ranks=model.ranks,
        hidden=len(lines) - len(keep),
        modules=model.size,
        stage=stage,
    )
