"""What the rules read: a run's facts computed once from a ``RunState``.

Per rank: how many bytes of parameters, gradients and optimizer state it
stores, on which devices, how it held the model before the engine wrapped it;
for the run: the engine, the driver, the full model size and the repeated
block a wrap policy would name.  Pure Python, linear in the number of modules.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property

from shardtop.config import format_bytes
from shardtop.events import Memory, Oom, Scalar, Shards, Tree
from shardtop.run_state import RankState, RunState
from shardtop.shard_model import subtree_sums

SHARDED_ENGINES = frozenset({"fsdp1", "fsdp2", "zero3"})
"""Engines that split parameters across ranks."""

FSDP_ENGINES = frozenset({"fsdp1", "fsdp2"})

CONTAINER_TYPES = frozenset({"Sequential", "ModuleList", "ModuleDict", "ParameterList", "ParameterDict"})
"""Modules that only hold others: never the block a wrap policy should name."""

BLOCK_MIN_SHARE = 0.5
"""A repeated module type with children is "the block" when its instances hold at least
half of the parameter bytes (a transformer layer holds nearly all of them); otherwise the
most repeated leaf type (``Linear`` in story 2) stands in."""

STORED_NOWHERE = frozenset({"meta"})
"""Devices that store nothing (deferred initialisation)."""


ROOT_LABEL = "(root)"
"""How the root module (path ``""``) is written for people: not ``model``, which is also the
name of many a LightningModule's attribute."""


def display_path(path: str) -> str:
    """A tree path for people: the root (``""``) is ``(root)``."""
    return path or ROOT_LABEL


def list_names(names: Sequence[str], limit: int = 6) -> str:
    """``a, b, c and 4 more``: a list of names short enough for one sentence."""
    shown = [display_path(n) for n in names[:limit]]
    if not shown:
        return ""
    if len(names) > limit:
        return ", ".join(shown) + f" and {len(names) - limit} more"
    if len(shown) == 1:
        return shown[0]
    return ", ".join(shown[:-1]) + " and " + shown[-1]


def fmt(n: int | float | None) -> str:
    return format_bytes(n)


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


@dataclass(frozen=True)
class RankFacts:
    """One rank's holdings, summed over the tree."""

    rank: int
    host: str
    device: str
    pid: int | None
    shards: Shards | None
    """The latest snapshot taken once the engine held the model (not ``setup``)."""
    setup: Shards | None
    memory: Memory | None
    oom: Oom | None
    param_bytes: int = 0
    grad_bytes: int | None = None
    optim_bytes: int | None = None
    by_device: Mapping[str, int] = field(default_factory=dict)
    """Stored parameter bytes per device (meta excluded)."""

    @property
    def holdings(self) -> Shards | None:
        """The best snapshot there is: after the engine, else the set-up one."""
        return self.shards or self.setup


def _sum(values: Sequence[int] | None) -> int | None:
    return None if values is None else sum(values)


def rank_facts(rs: RankState) -> RankFacts:
    latest = rs.shards
    engine_shards = latest if latest is not None and latest.stage != "setup" else None
    setup = rs.setup_shards
    held = engine_shards or setup
    by_device: dict[str, int] = {}
    param_bytes = 0
    if held is not None:
        per_device = [0] * len(held.devices)
        for b, d in zip(held.bytes, held.device):
            if b and 0 <= d < len(per_device):
                per_device[d] += b
        for name, b in zip(held.devices, per_device):
            if name not in STORED_NOWHERE and b:
                by_device[name] = by_device.get(name, 0) + b
        param_bytes = sum(by_device.values())
    return RankFacts(
        rank=rs.rank,
        host=rs.host,
        device=rs.device,
        pid=rs.pid,
        shards=engine_shards,
        setup=setup,
        memory=rs.memory,
        oom=rs.oom,
        param_bytes=param_bytes,
        grad_bytes=_sum(held.grad_bytes) if held is not None else None,
        optim_bytes=_sum(held.optim_bytes) if held is not None else None,
        by_device=by_device,
    )


@dataclass(frozen=True)
class RunFacts:
    """Everything the rules read, computed once."""

    state: RunState
    ranks: tuple[RankFacts, ...]

    @classmethod
    def of(cls, state: RunState) -> RunFacts:
        return cls(state, tuple(rank_facts(rs) for _, rs in sorted(state.ranks.items())))

    # -- the run ------------------------------------------------------------------

    @cached_property
    def engine(self) -> str:
        """The engine as the ranks hold the model; before that, what the ranks said they run.

        A set-up snapshot reads ``plain`` (nothing wrapped yet), which must not hide
        the ``zero3`` a rank announced: an OOM in set-up leaves only that snapshot.
        """
        for r in self.ranks:
            if r.shards is not None and r.shards.engine:
                return r.shards.engine
        for r in self.ranks:
            hello = self.state.ranks[r.rank].hello
            if hello is not None and hello.engine:
                return hello.engine
        for r in self.ranks:
            if r.setup is not None and r.setup.engine:
                return r.setup.engine
        return ""

    @property
    def world_size(self) -> int:
        return self.state.world_size

    @cached_property
    def strategy(self) -> str:
        for rs in self.state.ranks.values():
            if rs.hello is not None and rs.hello.strategy:
                return rs.hello.strategy
        return ""

    @cached_property
    def info(self) -> Mapping[str, Scalar]:
        """Engine-wide facts from the lowest rank's best snapshot (set-up facts under them)."""
        merged: dict[str, Scalar] = {}
        for r in reversed(self.ranks):
            if r.setup is not None:
                merged.update(r.setup.info)
        for r in reversed(self.ranks):
            if r.shards is not None:
                merged.update(r.shards.info)
        return merged

    @property
    def driver(self) -> str:
        return str(self.info.get("driver") or "")

    @property
    def lightning(self) -> bool:
        """Driven through a Lightning Trainer (the fix is then said in Lightning's words)."""
        driver = self.driver
        if driver:
            return driver.startswith("Lightning")
        return self.strategy.endswith("Strategy")

    @property
    def tree(self) -> Tree | None:
        return self.state.tree

    @property
    def paths(self) -> tuple[str, ...]:
        return self.state.paths

    @cached_property
    def subtree_bytes(self) -> list[int]:
        tree = self.tree
        return subtree_sums(tree.bytes, tree.parents) if tree is not None else []

    @property
    def full_bytes(self) -> int:
        """Bytes of every parameter at full size (the whole model, once)."""
        return self.subtree_bytes[0] if self.subtree_bytes else 0

    @property
    def full_params(self) -> int:
        return sum(self.tree.params) if self.tree is not None else 0

    @cached_property
    def block(self) -> Block | None:
        if self.tree is None or not self.paths:
            return None
        return find_block(self.tree, self.paths, self.subtree_bytes)

    def aligned(self, shards: Shards | None) -> bool:
        """Do ``shards``' arrays line up with the current tree?"""
        tree = self.tree
        return (
            shards is not None
            and tree is not None
            and shards.tree_id == tree.tree_id
            and len(shards.bytes) == len(tree.names)
        )

    @property
    def ooms(self) -> list[Oom]:
        return [r.oom for r in self.ranks if r.oom is not None]

    @property
    def engine_ranks(self) -> list[RankFacts]:
        """Ranks with a snapshot taken after the engine wrapped the model."""
        return [r for r in self.ranks if r.shards is not None]

    def first_engine_rank(self) -> RankFacts | None:
        ranks = self.engine_ranks
        return ranks[0] if ranks else None

    def path(self, row: int) -> str:
        return self.paths[row] if 0 <= row < len(self.paths) else ""
