"""The shard tree as the TUI and the report show it: subtree sums, folded siblings, per-rank figures.

Built once per tree/shards change in a worker thread (``ShardModel.build``),
then only read.  ``tree_lines`` turns it and the set of opened nodes into the
flat list of lines the ``ShardTree`` widget draws, so a 100 000-module model
costs what is open, not what exists.  Pure Python, no Textual.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from types import MappingProxyType
from typing import Literal

from shardtop.read.run_state import RunState, offloaded_of, offloaded_params
from shardtop.read.shard_placement import Placement, PlacementMasks, placement_masks
from shardtop.rundir.events import Shards, Tree, Unit, tree_paths

FOLD_MIN = 5
"""Fewer consecutive look-alike siblings than this stay separate rows (so q, k, v, o projections keep their names)."""

Figure = Literal["params", "grads", "optimizer", "activations", "offloaded", "total"]
"""What the rank columns count per module: one kind of memory, what the engine offloads to host memory, or
the four kinds on the rank's device summed."""
FIGURES: tuple[Figure, ...] = ("params", "grads", "optimizer", "activations", "offloaded", "total")
"""The choices, in the order the tree cycles through them."""
_PER_MODULE = {"grads": "grad_bytes", "optimizer": "optim_bytes", "activations": "act_bytes"}
"""The ``Shards`` list of each kind besides parameters."""
_OFFLOADED = {"grads": "offloaded_grad_bytes", "optimizer": "offloaded_optim_bytes"}
"""The ``Shards`` list of what of a kind the engine holds in host memory: the kind's figure leaves it out."""
_KINDS_IN_TOTAL: tuple[Figure, ...] = ("grads", "optimizer", "activations")


@dataclass(frozen=True)
class Fold:
    """Consecutive siblings of one type and parameter count, shown as one row.

    ``start:stop`` index the parent's children, so a fold is the same key
    across model rebuilds of the same tree.
    """

    parent: int
    start: int
    stop: int

    @property
    def count(self) -> int:
        return self.stop - self.start


Node = int | Fold
"""A line of the tree: a module row or a fold of sibling rows."""


@dataclass(frozen=True)
class RankCell:
    """How one rank holds one module."""

    rank: int
    own_bytes: int
    subtree_bytes: int
    device: str
    state: str
    unit: Unit | None


def subtree_sums(values: Sequence[int], parents: Sequence[int]) -> list[int]:
    """Each row's value plus its descendants' (rows are in pre-order: parents first)."""
    out = list(values)
    for i in range(len(out) - 1, 0, -1):
        p = parents[i]
        if p >= 0:
            out[p] += out[i]
    return out


def fold_children(
    parent: int, kids: Sequence[int], types: Sequence[int], params: Sequence[int], fold_min: int = FOLD_MIN
) -> tuple[Node, ...]:
    """Children with runs of ``fold_min`` or more same-type, same-size siblings folded."""
    out: list[Node] = []
    i, n = 0, len(kids)
    while i < n:
        t, p = types[kids[i]], params[kids[i]]
        j = i + 1
        while j < n and types[kids[j]] == t and params[kids[j]] == p:
            j += 1
        if j - i >= fold_min:
            out.append(Fold(parent, i, j))
        else:
            out.extend(kids[i:j])
        i = j
    return tuple(out)


@dataclass(frozen=True)
class ShardModel:
    """A tree, every rank's shards aligned with it, and the sums the columns show."""

    tree: Tree
    paths: tuple[str, ...]
    children: Mapping[int, tuple[int, ...]]
    """Child rows of every row that has children."""
    position: tuple[int, ...]
    """Index of each row among its parent's children."""
    entries: Mapping[int, tuple[Node, ...]]
    """Children of each parent row, folded."""
    params_total: tuple[int, ...]
    bytes_total: tuple[int, ...]
    """Full (unsharded) parameter bytes of each subtree."""
    ranks: tuple[int, ...]
    rank_bytes: Mapping[int, tuple[int, ...]]
    """Bytes of each subtree's parameters stored on each rank."""
    shards: Mapping[int, Shards]
    unit_roots: Mapping[int, Unit] = field(default_factory=lambda: MappingProxyType({}))
    """Modules a sharding unit is rooted at (the lowest rank's units: every rank has the same)."""
    placed: PlacementMasks | None = None
    """Where each subtree's parameters are, over every rank."""
    _figure_sums: dict[Figure, Mapping[int, tuple[int, ...] | None]] = field(
        default_factory=dict, init=False, repr=False, compare=False
    )
    """Subtree sums of each kind besides parameters, computed the first time a view asks for that kind."""

    @classmethod
    def build(
        cls, tree: Tree, shards: Mapping[int, Shards], paths: Sequence[str] | None = None, fold_min: int = FOLD_MIN
    ) -> ShardModel:
        n = len(tree.names)
        parents = tree.parents
        kids: dict[int, list[int]] = {}
        position = [0] * n
        for row in range(1, n):
            p = parents[row]
            if 0 <= p < n:
                siblings = kids.get(p)
                if siblings is None:
                    siblings = kids[p] = []
                position[row] = len(siblings)
                siblings.append(row)
        params_total = subtree_sums(tree.params, parents)
        entries = {row: fold_children(row, k, tree.types, params_total, fold_min) for row, k in kids.items()}
        usable = {rank: s for rank, s in sorted(shards.items()) if s.tree_id == tree.tree_id and len(s.bytes) == n}
        unit_roots: dict[int, Unit] = {}
        if usable:
            for unit in usable[min(usable)].units:
                for row in (unit.module, *unit.also):
                    unit_roots.setdefault(row, unit)
        return cls(
            tree=tree,
            paths=tuple(paths) if paths is not None else tuple(tree_paths(tree.names, parents)),
            children=MappingProxyType({row: tuple(k) for row, k in kids.items()}),
            position=tuple(position),
            entries=MappingProxyType(entries),
            params_total=tuple(params_total),
            bytes_total=tuple(subtree_sums(tree.bytes, parents)),
            ranks=tuple(usable),
            rank_bytes=MappingProxyType({rank: tuple(subtree_sums(s.bytes, parents)) for rank, s in usable.items()}),
            shards=MappingProxyType(usable),
            unit_roots=MappingProxyType(unit_roots),
            placed=placement_masks(usable, parents, tree.params) if usable else None,
        )

    @classmethod
    def of(cls, state: RunState) -> ShardModel | None:
        """The shard model of a run's current tree and every rank's latest snapshot of it."""
        if state.tree is None:
            return None
        shards = {r.rank: r.shards for r in state.rank_list() if r.shards is not None}
        return cls.build(state.tree, shards, state.paths)

    # -- lookups ------------------------------------------------------------------

    @property
    def size(self) -> int:
        return len(self.paths)

    @cached_property
    def _index(self) -> dict[str, int]:
        return {p: i for i, p in enumerate(self.paths)}

    @cached_property
    def _lower_paths(self) -> tuple[str, ...]:
        return tuple(p.lower() for p in self.paths)

    def row_of(self, path: str) -> int | None:
        return self._index.get(path)

    def type_of(self, row: int) -> str:
        return self.tree.type_names[self.tree.types[row]]

    def name_of(self, row: int) -> str:
        return self.tree.names[row] if row else "model"

    def kids_of(self, node: Node) -> Sequence[Node]:
        if isinstance(node, Fold):
            return self.members(node)
        return self.entries.get(node, ())

    def members(self, fold: Fold) -> tuple[int, ...]:
        return self.children.get(fold.parent, ())[fold.start : fold.stop]

    def fold_label(self, fold: Fold) -> str:
        members = self.members(fold)
        first, last = self.tree.names[members[0]], self.tree.names[members[-1]]
        return f"{first} … {last}"

    def fold_containing(self, row: int) -> Fold | None:
        parent = self.tree.parents[row] if row else -1
        if parent < 0:
            return None
        pos = self.position[row]
        for entry in self.entries.get(parent, ()):
            if isinstance(entry, Fold) and entry.start <= pos < entry.stop:
                return entry
        return None

    def ancestors(self, row: int) -> list[int]:
        """Rows from the root down to ``row``'s parent."""
        out: list[int] = []
        p = self.tree.parents[row] if 0 <= row < self.size else -1
        while p >= 0:
            out.append(p)
            p = self.tree.parents[p]
        return out[::-1]

    def reveal(self, row: int) -> list[Node]:
        """The nodes to open so that ``row`` is visible: its ancestors and the folds holding them."""
        opened: list[Node] = []
        for node in [*self.ancestors(row), row]:
            fold = self.fold_containing(node)
            if fold is not None:
                opened.append(fold)
            if node != row:
                opened.append(node)
        return opened

    def search(self, query: str) -> list[int]:
        """Rows whose path contains ``query`` (case-insensitive), in tree order."""
        q = query.strip().lower()
        if not q:
            return []
        return [i for i, p in enumerate(self._lower_paths) if q in p]

    # -- numbers ------------------------------------------------------------------

    def node_params(self, node: Node) -> int:
        if isinstance(node, Fold):
            return sum(self.params_total[m] for m in self.members(node))
        return self.params_total[node]

    def node_bytes(self, node: Node, rank: int) -> int:
        """Bytes of the node's subtree held on ``rank``."""
        per_row = self.rank_bytes.get(rank)
        if per_row is None:
            return 0
        if isinstance(node, Fold):
            return sum(per_row[m] for m in self.members(node))
        return per_row[node]

    def node_figure(self, node: Node, rank: int, figure: Figure = "params") -> int | None:
        """Bytes of ``figure`` in the node's subtree on ``rank``; None where the rank reported none
        of that kind (a snapshot taken before any gradient, optimizer state or explained forward)."""
        if figure == "params":
            return self.node_bytes(node, rank)
        per_row = self.figure_sums(figure).get(rank)
        if per_row is None:
            return None
        if isinstance(node, Fold):
            return sum(per_row[m] for m in self.members(node))
        return per_row[node]

    def figure_sums(self, figure: Figure) -> Mapping[int, tuple[int, ...] | None]:
        """Each rank's subtree sums of ``figure`` (``total``: parameters plus every kind the rank
        reported); None for a rank without that kind.  Summed once, when first asked for."""
        if figure == "params":
            return self.rank_bytes
        found = self._figure_sums.get(figure)
        if found is None:
            found = self._figure_sums[figure] = MappingProxyType(
                {rank: self._sums(figure, rank) for rank in self.ranks}
            )
        return found

    def _sums(self, figure: Figure, rank: int) -> tuple[int, ...] | None:
        """Subtree sums of ``figure`` on ``rank``: gradients and optimizer state on the rank's device (what the
        engine offloads is the ``offloaded`` figure's, with the parameters held offloaded), and their
        ``total`` with the parameters and activations on the device."""
        s = self.shards[rank]
        parents = self.tree.parents
        if figure == "total":
            kinds = [v for k in _KINDS_IN_TOTAL if (v := self.figure_sums(k).get(rank)) is not None]
            host = subtree_sums(offloaded_params(s), parents)
            return tuple(map(sum, zip(self.rank_bytes[rank], (-h for h in host), *kinds, strict=True)))
        if figure == "offloaded":
            parts = [offloaded_params(s), *(v for k in _OFFLOADED.values() if (v := getattr(s, k)) is not None)]
            return tuple(subtree_sums(list(map(sum, zip(*parts, strict=True))), parents))
        own = getattr(s, _PER_MODULE[figure])
        if own is None or len(own) != self.size:
            return None
        key = _OFFLOADED.get(figure)
        moved = getattr(s, key) if key is not None else None
        if moved is not None and len(moved) == len(own):
            own = [held - off for held, off in zip(own, moved, strict=True)]
        return tuple(subtree_sums(own, parents))

    @cached_property
    def figures(self) -> tuple[Figure, ...]:
        """The figures the rank columns offer: ``offloaded`` only where some rank's engine offloads."""
        if any(offloaded_of(s).total for s in self.shards.values()):
            return FIGURES
        return tuple(f for f in FIGURES if f != "offloaded")

    def node_full_bytes(self, node: Node) -> int:
        if isinstance(node, Fold):
            return sum(self.bytes_total[m] for m in self.members(node))
        return self.bytes_total[node]

    def rank_cells(self, row: int) -> list[RankCell]:
        cells = []
        for rank in self.ranks:
            s = self.shards[rank]
            device = s.devices[s.device[row]] if 0 <= s.device[row] < len(s.devices) else ""
            state = s.states[s.state[row]] if 0 <= s.state[row] < len(s.states) else ""
            unit = s.units[s.unit[row]] if 0 <= s.unit[row] < len(s.units) else None
            cells.append(RankCell(rank, s.bytes[row], self.rank_bytes[rank][row], device, state, unit))
        return cells

    def placement(self, node: Node) -> Placement:
        """How and where the ranks hold the node's parameters, its descendants' included."""
        if self.placed is None:
            return Placement((), ())
        return self.placed.placement(self.members(node) if isinstance(node, Fold) else (node,))
