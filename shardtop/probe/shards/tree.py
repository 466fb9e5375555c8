"""The user's module tree, walked once: rows in pre-order, engine wrappers folded away.

Every reader starts from this walk, so it is the only place that visits every
module.  It is iterative (a 100 000-deep ``nn.Sequential`` chain must not hit
the recursion limit) and touches ``_modules`` and ``_parameters`` directly:
``named_modules()`` and ``named_parameters()`` build prefixes and generators
per module, which costs several times more on a 100 000-module model.

Wrappers (FSDP1, DDP, the DeepSpeed engine, Lightning's wrappers, see
``names.py``) never become rows: they map to the row of the user's module they
wrap, and are kept in ``wrappers`` because the readers need them (an FSDP1
wrapper holds its unit's ``FlatParamHandle``, the DeepSpeed engine its
optimizer).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from shardtop.probe.names import WRAPPER_SEGMENTS, WRAPPER_TYPES, user_class


@dataclass
class ModuleTree:
    """The rows of a ``Tree`` event plus what the readers need to fill ``Shards``."""

    names: list[str] = field(default_factory=list)
    parents: list[int] = field(default_factory=list)
    types: list[int] = field(default_factory=list)
    type_names: list[str] = field(default_factory=list)
    modules: list[Any] = field(default_factory=list)
    """The user's module object of each row."""
    row_of: dict[int, int] = field(default_factory=dict)
    """``id(module)`` -> row, for the user's modules and the wrappers around them."""
    wrappers: list[tuple[Any, int]] = field(default_factory=list)
    """Each wrapper with the row of the module it wraps, outermost first."""
    params: list[Any] = field(default_factory=list)
    """Every distinct registered parameter, in the order its first owner was reached."""
    param_rows: list[int] = field(default_factory=list)
    """Row of each parameter's first owner (shared parameters count once, there)."""
    param_index: dict[int, int] = field(default_factory=dict)
    """``id(parameter)`` -> index into ``params``."""

    def __len__(self) -> int:
        return len(self.names)

    def row_of_param(self, param: Any) -> int:
        """Row of a registered parameter's first owner, -1 for one the walk did not see."""
        index = self.param_index.get(id(param))
        return -1 if index is None else self.param_rows[index]

    def subtree_ends(self) -> list[int]:
        """``end[i]``: rows ``i .. end[i]-1`` are module ``i`` and its descendants (pre-order)."""
        ends = list(range(1, len(self.parents) + 1))
        for row in range(len(self.parents) - 1, 0, -1):
            parent = self.parents[row]
            if parent >= 0 and ends[row] > ends[parent]:
                ends[parent] = ends[row]
        return ends


class _TypeNames:
    """Interns class names and remembers which classes are wrappers, once per class."""

    def __init__(self) -> None:
        self.names: list[str] = []
        self._index: dict[str, int] = {}
        self.index_of: dict[type, int] = {}
        self.wrapper_of: dict[type, bool] = {}

    def index(self, cls: type) -> int:
        found = self.index_of.get(cls)
        if found is None:
            name = user_class(cls).__name__
            found = self._index.get(name)
            if found is None:
                found = self._index[name] = len(self.names)
                self.names.append(name)
            self.index_of[cls] = found
        return found

    def is_wrapper(self, cls: type) -> bool:
        found = self.wrapper_of.get(cls)
        if found is None:
            found = self.wrapper_of[cls] = any(c.__name__ in WRAPPER_TYPES for c in cls.__mro__)
        return found


def walk(root: Any) -> ModuleTree:
    """Every module under ``root`` once, in pre-order, with its own parameters.

    A child reached through a wrapper takes the wrapper's name and parent; a
    child under a wrapper segment name (``_fsdp_wrapped_module``...) of an
    ordinary module merges into that module's row.  Shared modules and shared
    parameters are counted at their first owner only.
    """
    tree = ModuleTree()
    types = _TypeNames()
    wrapper_of, index_of = types.wrapper_of, types.index_of  # inlined lookups: this loop runs per module
    row_of = tree.row_of
    names, parents, type_rows, modules = tree.names, tree.parents, tree.types, tree.modules
    params, param_rows, param_index = tree.params, tree.param_rows, tree.param_index
    segments = WRAPPER_SEGMENTS
    # (module, name, parent row, wrappers waiting for a row, row to merge into or -1)
    stack: list[tuple[Any, str, int, tuple[Any, ...], int]] = [(root, "", -1, (), -1)]
    pop, push = stack.pop, stack.append
    while stack:
        module, name, parent, pending, merge = pop()
        key = id(module)
        if key in row_of:
            continue
        cls = type(module)
        wrapper = wrapper_of.get(cls)
        if wrapper is None:
            wrapper = types.is_wrapper(cls)
        if merge >= 0:
            row = merge
        elif wrapper:
            row = -1
            row_of[key] = -1  # visited; set to the wrapped row once that row exists
        else:
            row = len(names)
            names.append(name)
            parents.append(parent)
            type_index = index_of.get(cls)
            type_rows.append(type_index if type_index is not None else types.index(cls))
            modules.append(module)
            for outer in pending:
                row_of[id(outer)] = row
                tree.wrappers.append((outer, row))
                _own_params(outer, row, params, param_rows, param_index)
        if row >= 0:
            row_of[key] = row
            if wrapper:
                tree.wrappers.append((module, row))
            for param in module._parameters.values():
                if param is not None:
                    pid = id(param)
                    if pid not in param_index:
                        param_index[pid] = len(params)
                        params.append(param)
                        param_rows.append(row)
        children = module._modules
        if not children:
            continue
        if not wrapper:
            for child_name, child in reversed(children.items()):
                if child is not None:
                    push((child, child_name, row, (), row if child_name in segments else -1))
        elif row < 0:
            for child in reversed(children.values()):
                if child is not None:
                    push((child, name, parent, pending + (module,), -1))
        else:
            for child_name, child in reversed(children.items()):
                if child is not None:
                    push((child, child_name, row, (), row))
    tree.type_names = types.names
    return tree


def _own_params(
    module: Any, row: int, params: list[Any], param_rows: list[int], param_index: dict[int, int]
) -> None:
    for param in module._parameters.values():
        if param is None:
            continue
        key = id(param)
        if key not in param_index:
            param_index[key] = len(params)
            params.append(param)
            param_rows.append(row)
