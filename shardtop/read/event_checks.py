"""What the fold does not trust: a tree or shards that contradict themselves or the tree in hand.

Pure Python; ``run_fold.RunStateBuilder`` counts what fails these checks as
``inconsistent`` and leaves it out, so one bad event never breaks a view.
"""

from __future__ import annotations

from operator import lt

from shardtop.rundir.events import Shards, Tree


def tree_problem(tree: Tree) -> str:
    """Why a tree cannot be drawn (columns of different lengths, parents outside it), or ``""``.

    Every check is a pass in C (``min``, ``max``, ``map``): trees have 100 000 rows.
    """
    n = len(tree.names)
    if n == 0:
        return "it has no rows"
    if any(len(col) != n for col in (tree.parents, tree.types, tree.params, tree.bytes)):
        return "its columns differ in length"
    if tree.parents[0] != -1:
        return "its first row is not the root"
    later = tree.parents[1:]
    if later and (min(later) < 0 or not all(map(lt, later, range(1, n)))):
        return "a parent row points outside the tree or after its child"
    if min(tree.types) < 0 or max(tree.types) >= len(tree.type_names):
        return "a type index points outside type_names"
    if min(tree.params) < 0 or min(tree.bytes) < 0:
        return "a size is negative"
    return ""


def shards_problem(shards: Shards) -> str:
    """Why a rank's shards cannot be read (arrays of different lengths, indexes out of range), or ``""``."""
    n = len(shards.bytes)
    columns = [shards.device, shards.state, shards.unit]
    kinds = (shards.grad_bytes, shards.optim_bytes, shards.offloaded_grad_bytes, shards.offloaded_optim_bytes)
    columns += [c for c in kinds if c is not None]
    if any(len(col) != n for col in columns):
        return "its arrays differ in length"
    if not _within(shards.device, len(shards.devices)):
        return "a device index is out of range"
    if not _within(shards.state, len(shards.states)):
        return "a state index is out of range"
    if not _within(shards.unit, len(shards.units)):
        return "a unit index is out of range"
    if any(not 0 <= u.module < n for u in shards.units):
        return "a unit is rooted outside the tree"
    return ""


def _within(indexes: list[int], size: int) -> bool:
    """Every index is -1 (none) or points into a list of ``size`` (min and max: one pass each, in C)."""
    return not indexes or (min(indexes) >= -1 and max(indexes) < size)


def fits(shards: Shards, tree: Tree | None) -> bool:
    """Shards of the tree in hand must have one entry per row; shards of another tree wait for theirs."""
    return tree is None or shards.tree_id != tree.tree_id or len(shards.bytes) == len(tree.names)


def same_tree(a: Tree, b: Tree) -> bool:
    """The same module tree (every rank sends its own copy), whoever sent it and when."""
    return (
        a.tree_id == b.tree_id
        and a.names == b.names
        and a.parents == b.parents
        and a.types == b.types
        and a.type_names == b.type_names
        and a.params == b.params
        and a.bytes == b.bytes
    )
