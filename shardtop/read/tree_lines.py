"""The shard tree's visible lines: the lines the open nodes show, and which nodes are open.

``visible_lines`` turns a ``ShardModel`` and the set of opened nodes into the
flat list of lines (pre-order, with their tree guides) that the ``ShardTree``
widget draws and the report prints; ``lines_below`` and ``subtree_end`` open
and close one line in place, ``parent_line`` and ``line_of`` find a line in the
list, and ``iter_lines_from`` starts the walk part-way down, so a 100 000-module
model costs what is open, not what exists.
``default_expanded``, ``oom_marks`` and ``translate_expanded`` say which nodes
are open or marked.  Pure Python, no Textual.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Iterator, Sequence
from dataclasses import dataclass

from shardtop.read.shard_model import Fold, Node, ShardModel


@dataclass(frozen=True)
class Line:
    """One visible line: what it shows and how it is drawn."""

    node: Node
    guide: str
    """Tree guides before the label (``│ ├─``)."""
    expandable: bool
    expanded: bool


def visible_lines(model: ShardModel, expanded: Collection[Node]) -> list[Line]:
    """The lines the tree shows when the nodes in ``expanded`` are open (pre-order)."""
    if not model.size:
        return []
    return list(_walk(model, [(0, "", "")], expanded))


def lines_below(model: ShardModel, line: Line, expanded: Collection[Node]) -> list[Line]:
    """The lines under ``line`` once it is opened: what to splice in after it."""
    guide = line.guide
    child_prefix = guide[:-2] + ("  " if guide.endswith("└─") else "│ ") if guide else ""
    return list(_walk(model, _children(model, line.node, child_prefix), expanded))


def _children(model: ShardModel, node: Node, prefix: str) -> list[tuple[Node, str, str]]:
    """Stack entries for ``node``'s children, last child first (so the first pops first)."""
    kids = model.kids_of(node)
    return list(_entries(kids, range(len(kids) - 1, -1, -1), prefix))


def iter_visible_lines(model: ShardModel, expanded: Collection[Node]) -> Iterator[Line]:
    """``visible_lines`` one at a time: a first frame stops at the lines it has room for."""
    return _walk(model, [(0, "", "")], expanded) if model.size else iter(())


def iter_lines_from(model: ShardModel, expanded: Collection[Node], way: Sequence[Node], start: int) -> Iterator[Line]:
    """``iter_visible_lines`` from the line of ``kids_of(way[-1])[start]`` on, without walking the lines
    before it: the lines the whole walk yields from there, in order.

    ``way``: the root first, each node a child of the one before, every one of them open.
    """
    stack: list[tuple[Node, str, str]] = []
    prefix = ""
    for parent, child in zip(way, way[1:], strict=False):
        kids = model.kids_of(parent)
        at = kids.index(child)
        stack.extend(_entries(kids, range(len(kids) - 1, at, -1), prefix))  # its later siblings, last first
        prefix += "  " if at == len(kids) - 1 else "│ "
    kids = model.kids_of(way[-1])
    stack.extend(_entries(kids, range(len(kids) - 1, start - 1, -1), prefix))
    return _walk(model, stack, expanded)


def _entries(kids: Sequence[Node], indices: Iterable[int], prefix: str) -> Iterator[tuple[Node, str, str]]:
    """Stack entries (node, its guide, its children's prefix) for ``kids[i]``, ``i`` in ``indices``."""
    last = len(kids) - 1
    for i in indices:
        yield kids[i], prefix + ("└─" if i == last else "├─"), prefix + ("  " if i == last else "│ ")


def _walk(model: ShardModel, stack: list[tuple[Node, str, str]], expanded: Collection[Node]) -> Iterator[Line]:
    while stack:
        node, guide, child_prefix = stack.pop()
        has_kids = bool(model.kids_of(node))
        is_open = has_kids and node in expanded
        yield Line(node, guide, has_kids, is_open)
        if is_open:
            stack.extend(_children(model, node, child_prefix))


def subtree_end(lines: Sequence[Line], index: int) -> int:
    """Index just past the lines drawn under ``lines[index]`` (its open descendants)."""
    depth = len(lines[index].guide)
    end = index + 1
    while end < len(lines) and len(lines[end].guide) > depth:
        end += 1
    return end


def parent_line(lines: Sequence[Line], index: int) -> int:
    """Index of the line that ``lines[index]`` hangs under; -1 for a line at the top."""
    depth = len(lines[index].guide)
    parent = index - 1
    while parent >= 0 and len(lines[parent].guide) >= depth:
        parent -= 1
    return parent


def line_of(lines: Sequence[Line], row: int) -> int:
    """Index of the line that shows module ``row``; 0 where none does (it lies inside a closed node)."""
    for i, line in enumerate(lines):
        if line.node == row:
            return i
    return 0


def default_expanded(model: ShardModel) -> set[Node]:
    """The root, and down any chain of single children (``model → net``; folds stay shut)."""
    opened: set[Node] = set()
    node: Node = 0
    while model.size:
        opened.add(node)
        kids = model.kids_of(node)
        if len(kids) != 1 or isinstance(kids[0], Fold):
            break
        node = kids[0]
    return opened


def oom_marks(model: ShardModel, path: str | None) -> frozenset[Node]:
    """The culprit's row and every node that holds it, for marking the way to the OOM."""
    if path is None:
        return frozenset()
    row = model.row_of(path)
    if row is None:
        return frozenset()
    return frozenset([row, *model.reveal(row)])


def translate_expanded(old: ShardModel, new: ShardModel, expanded: Collection[Node]) -> set[Node]:
    """Keep what the user opened when the tree is replaced, by module path."""
    out: set[Node] = set()
    for node in expanded:
        if isinstance(node, Fold):
            members = old.members(node) if node.parent < old.size else ()
            row = new.row_of(old.paths[members[0]]) if members else None
            fold = new.fold_containing(row) if row is not None else None
            if fold is not None:
                out.add(fold)
        elif node < old.size:
            row = new.row_of(old.paths[node])
            if row is not None:
                out.add(row)
    return out
