"""Which module's backward was running: the part of an OOM a traceback cannot show.

A backward pass runs inside autograd's C++ engine, so the Python traceback of
an OOM there ends at ``loss.backward()``.  Three answers, tried in this order
(``blame_backward``):

* **The failed graph, at no cost per step** (``module_of_failed_graph``).
  The loss is still referenced by the traceback's frames, and so is its
  graph.  Autograd frees a node's saved tensors right after running it, so
  after the failure the nodes that ran have released theirs and the failing
  node has not; the engine runs ready nodes in decreasing sequence number,
  so the failing node is the unreleased one with the highest number.
  Parameters (the graph's ``AccumulateGrad`` leaves) tie nodes to the
  modules owning them; an FSDP1 flat parameter's split says which original
  parameter, hence which leaf module.  It cannot tell when nothing was
  released (``retain_graph=True``, or an OOM in the loss's own backward), and
  then says nothing.  Reading the graph costs about 1 s for 18 000 layers,
  once, at the OOM.
* **The autograd node CUDA's OOM observer saw** (``owner_of_node``): the
  node running when the allocator gave up, CUDA only.
* **Hooks** (``ModuleTracker(..., hooks=True)``): a forward hook on every
  module owning parameters registers a pre-hook on its output's autograd
  node, which records the module when backward reaches it.  About 19 µs per
  tracked module per step on CPU (+20 % on a 1000-module model of
  ``Linear(64, 64)``; within noise with ``Linear(512, 512)``), so opt-in;
  under FSDP1 it names units only.

Only modules owning parameters are named: they are where gradients are
computed.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from shardtop.probe.eager import compiling
from shardtop.probe.names import clean_path, module_names, user_type_name

_graph_task_id: Callable[[], int] = getattr(torch._C, "_current_graph_task_id", lambda: -1)
MAX_NODES = 2_000_000
PASS_THROUGH_DEPTH = 6
"""How many tensor-free nodes (``TBackward``, views, casts) may sit between a parameter and its use."""


@dataclass(frozen=True)
class TrackedModule:
    """A module the tracker names: its clean path and its type."""

    path: str
    type_name: str


def tracked_modules(root: nn.Module) -> Iterator[nn.Module]:
    """Modules owning a parameter themselves (not only through children), once each."""
    seen: set[int] = set()
    for module in root.modules():
        if id(module) not in seen:
            seen.add(id(module))
            if next(module.parameters(recurse=False), None) is not None:
                yield module


def first_grad_fn(output: Any) -> Any:
    """The autograd node of a module's output: a tensor, or the first tensor of a tuple/list/dict."""
    node = getattr(output, "grad_fn", None)
    if node is not None or isinstance(output, torch.Tensor):
        return node
    if isinstance(output, dict):
        output = list(output.values())
    if isinstance(output, (tuple, list)):
        for item in output:
            node = getattr(item, "grad_fn", None)
            if node is not None:
                return node
    return None


@dataclass
class ModuleIndex:
    """The modules under some roots, as an OOM needs them: built at OOM time only."""

    owners: dict[int, TrackedModule]
    """``id(parameter) -> module``."""
    types: dict[str, str]
    """``path -> type name`` of every module."""

    @classmethod
    def of(cls, roots: Iterable[nn.Module], names: dict[int, str]) -> ModuleIndex:
        owners: dict[int, TrackedModule] = {}
        types: dict[str, str] = {}
        for root in roots:
            paths = {**module_names(root), **names}
            for module in root.modules():
                path = paths.get(id(module), "")
                types.setdefault(path, user_type_name(module))
                entry = TrackedModule(path, user_type_name(module))
                for param in module.parameters(recurse=False):
                    owners.setdefault(id(param), entry)
        return cls(owners, types)


class ModuleTracker:
    """The model's root, for naming the module of a failed backward; hooks (opt-in) add a per-step answer.

    Without hooks, ``install()`` does nothing and costs nothing per step.
    """

    def __init__(self, root_module: nn.Module, names: dict[int, str] | None = None, *, hooks: bool = False) -> None:
        self.root = root_module
        self.names = names if names is not None else {}
        self.hooks = hooks
        self._handles: list[Any] = []
        self._backward: TrackedModule | None = None
        self._types: dict[str, str] = {}
        self.failed: Exception | None = None
        """Set if a hook failed: the hooks then do nothing and name nothing (training goes on)."""

    @property
    def installed(self) -> bool:
        return bool(self._handles)

    @property
    def current_backward(self) -> str | None:
        """Path of the module whose backward began last (hooks only)."""
        entry = self._backward
        return entry.path if entry is not None else None

    def current_module(self, phase: str) -> str | None:
        """The hooks' answer for an OOM in ``phase``; only backward is tracked."""
        return self.current_backward if phase == "backward" else None

    def type_of(self, path: str) -> str | None:
        return self._types.get(path)

    def install(self) -> int:
        """Hook every module that owns parameters if ``hooks``; returns how many (idempotent)."""
        if self._handles or not self.hooks:
            return len(self._handles)
        fallback: dict[int, str] | None = None
        for module in tracked_modules(self.root):
            path = self.names.get(id(module))
            if path is None:
                fallback = fallback if fallback is not None else module_names(self.root)
                path = fallback.get(id(module), "")
            entry = TrackedModule(path, user_type_name(module))
            self._types[path] = entry.type_name
            self._handles.append(module.register_forward_hook(self._hook_for(entry)))
        return len(self._handles)

    def remove(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        self._backward = None

    def _hook_for(self, entry: TrackedModule) -> Callable[[nn.Module, Any, Any], None]:
        tracker = self

        def backward_began(grad_outputs: Any) -> None:
            tracker._backward = entry

        def after_forward(module: nn.Module, args: Any, output: Any) -> None:
            if tracker.failed is not None or compiling():
                return
            try:
                if tracker._backward is not None and _graph_task_id() < 0:
                    # A new forward outside any backward: the last step's answer is stale.
                    # (Inside a backward it is a checkpoint recomputation: keep it.)
                    tracker._backward = None
                node = first_grad_fn(output)
                if node is not None:
                    node.register_prehook(backward_began)
            except Exception as e:  # noqa: BLE001 - a hook runs inside the user's forward: never raise there
                tracker.failed = e
                tracker._backward = None

        return after_forward

    # -- at OOM time, without hooks ----------------------------------------------------

    def module_of_node(self, node: Any) -> TrackedModule | None:
        """The module owning the parameters nearest below an autograd node (the observer's)."""
        return owner_of_node(node, ModuleIndex.of([self.root], self.names).owners)

    def module_of_graph(self, outputs: Iterable[Any]) -> TrackedModule | None:
        """The module whose backward failed, read from the graph of ``outputs`` (the loss)."""
        return module_of_failed_graph(outputs, ModuleIndex.of([self.root], self.names))


def owner_of_node(node: Any, owners: dict[int, TrackedModule], max_nodes: int = 256) -> TrackedModule | None:
    """Breadth-first from ``node`` towards the inputs: the owner of the first parameter met."""
    queue = [node]
    seen: set[int] = set()
    while queue and len(seen) < max_nodes:
        current = queue.pop(0)
        if current is None or id(current) in seen:
            continue
        seen.add(id(current))
        variable = getattr(current, "variable", None)
        if variable is not None and id(variable) in owners:
            return owners[id(variable)]
        queue.extend(nxt for nxt, _ in getattr(current, "next_functions", ()) or ())
    return None


# -- reading a failed backward's graph -----------------------------------------------------

_SAVED: dict[type, tuple[str, ...]] = {}


def holds_saved_tensors(node: Any) -> bool | None:
    """True while a node keeps saved tensors, False once autograd released them, None if it saves none."""
    kind = type(node)
    names = _SAVED.get(kind)
    if names is None:
        names = tuple(a for a in dir(node) if a.startswith("_saved_") or a == "saved_tensors")
        _SAVED[kind] = names
    for name in names:
        try:
            value = getattr(node, name)
        except RuntimeError:
            return False  # autograd releases all of a node's saved tensors at once
        if isinstance(value, torch.Tensor) or (
            isinstance(value, (tuple, list)) and any(isinstance(v, torch.Tensor) for v in value)
        ):
            return True
    return None


class _States:
    """``holds_saved_tensors`` once per node of one analysis."""

    def __init__(self) -> None:
        self._known: dict[int, bool | None] = {}

    def __call__(self, node: Any) -> bool | None:
        key = id(node)
        if key not in self._known:
            self._known[key] = holds_saved_tensors(node)
        return self._known[key]


def _graph(outputs: Iterable[Any]) -> tuple[list[Any], dict[int, list[Any]]]:
    """Every node reachable from ``outputs``, and each node's parents (the nodes feeding it gradients)."""
    nodes: list[Any] = []
    parents: dict[int, list[Any]] = {}
    stack = [t.grad_fn for t in outputs if getattr(t, "grad_fn", None) is not None]
    seen = {id(n) for n in stack}
    while stack and len(nodes) < MAX_NODES:
        node = stack.pop()
        nodes.append(node)
        for child, _ in node.next_functions:
            if child is None:
                continue
            parents.setdefault(id(child), []).append(node)
            if id(child) not in seen:
                seen.add(id(child))
                stack.append(child)
    return nodes, parents


def _users_of_parameters(
    nodes: list[Any], parents: dict[int, list[Any]], index: ModuleIndex, state: _States
) -> dict[int, TrackedModule]:
    """``id(node) -> module`` for the nodes computing with a module's parameters.

    From each parameter's ``AccumulateGrad`` up through tensor-free nodes
    (``TBackward``, views, dtype casts) to the first nodes holding tensors.
    An FSDP1 flat parameter is split into its original parameters' views
    first: the split's output number says which original parameter, so the
    answer is the leaf module, not the whole unit.
    """
    users: dict[int, TrackedModule] = {}
    for node in nodes:
        variable = getattr(node, "variable", None)
        owner = index.owners.get(id(variable))
        if owner is None:
            continue
        fqns = flat_parameter_fqns(variable)
        frontier = [(parent, owner) for parent in parents.get(id(node), [])]
        for depth in range(PASS_THROUGH_DEPTH):
            passing: list[tuple[Any, TrackedModule]] = []
            for parent, who in frontier:
                if state(parent) is not None:
                    users.setdefault(id(parent), who)
                    continue
                for grand in parents.get(id(parent), []):
                    if depth == 0 and fqns is not None:
                        nr = next((i for n, i in grand.next_functions if n is parent), -1)
                        passing.append((grand, _refine(who, fqns, nr, index.types)))
                    else:
                        passing.append((grand, who))
            if not passing:
                break
            frontier = passing
    return users


def flat_parameter_fqns(param: Any) -> list[str | None] | None:
    """An FSDP1 ``FlatParameter``'s original parameter names, by split output (None for padding)."""
    fqns = getattr(param, "_fqns", None)
    if not isinstance(fqns, (list, tuple)):
        return None
    padding = getattr(param, "_is_padding_mask", None)
    if not padding or len(padding) == len(fqns):
        return list(fqns)
    names = iter(fqns)
    return [None if is_padding else next(names, None) for is_padding in padding]


def _refine(owner: TrackedModule, fqns: list[str | None], nr: int, types: dict[str, str]) -> TrackedModule:
    fqn = fqns[nr] if 0 <= nr < len(fqns) else None
    if fqn is None:
        return owner
    relative = clean_path(fqn.rpartition(".")[0])
    path = f"{owner.path}.{relative}" if owner.path and relative else owner.path or relative
    return TrackedModule(path, types.get(path, owner.type_name))


def module_of_failed_graph(outputs: Iterable[Any], index: ModuleIndex) -> TrackedModule | None:
    """The module whose backward failed (see the module docstring); None when the graph cannot say."""
    nodes, parents = _graph(outputs)
    state = _States()
    users = _users_of_parameters(nodes, parents, index, state)
    ordered = sorted((n for n in nodes if getattr(n, "variable", None) is None), key=lambda n: -n._sequence_nr())
    released_above = False
    above: TrackedModule | None = None
    failing_found = False
    for node in ordered:
        holds = state(node)
        user = users.get(id(node))
        if holds is False:
            released_above = True
            above = user or above
        elif holds is True and released_above:
            if user is not None:
                return user if not failing_found or above is None else _common(above, user, index.types)
            failing_found = True  # a parameterless op failed: name what it sits between
    return None


def _common(above: TrackedModule, below: TrackedModule, types: dict[str, str]) -> TrackedModule:
    """The innermost module holding both (``blocks.2.mlp`` for its ``fc2`` and ``fc1``); ``below`` if only
    the root does."""
    shared: list[str] = []
    for x, y in zip(above.path.split("."), below.path.split("."), strict=False):
        if x != y:
            break
        shared.append(x)
    path = ".".join(shared)
    if not path:
        return below
    return TrackedModule(path, types.get(path, ""))


def blame_backward(
    roots: list[nn.Module], outputs: list[Any], names: dict[int, str], tracker: Any, node: Any = None
) -> TrackedModule | None:
    """The module whose backward failed: from the failed graph, the node CUDA's observer saw, or hooks.

    ``roots`` are the modules to look parameters up in (the tracker's root and
    any module whose method is on the failing stack, such as a
    LightningModule's ``backward``); ``outputs`` what the backward differentiated.
    """
    index = ModuleIndex.of(roots, names) if roots else None
    if index is not None and index.owners:
        found = module_of_failed_graph(outputs, index) if outputs else None
        if found is None and node is not None:
            found = owner_of_node(node, index.owners)
        if found is not None:
            return found
    path = tracker.current_module("backward") if tracker is not None else None
    return TrackedModule(path, tracker.type_of(path) or "") if path is not None else None
