"""Which module's backward was running: the part of an OOM a traceback cannot show.

A backward pass runs inside autograd's C++ engine, so the Python traceback of
an OOM there ends at ``loss.backward()``.  ``ModuleTracker`` fills that gap
cheaply: a forward hook on every module that owns parameters registers a
pre-hook on the autograd node that produced the module's output.  Backward
reaches that node just before it computes the module's gradients, and the
pre-hook records the module's path.  At an OOM, the module recorded last is
the one whose backward was running (or, for a parameterless op between two
tracked modules, the tracked module just after it in forward order).

Why this design: it needs nothing from the engine (DeepSpeed's
``FWD_MODULE_STACK`` and FSDP1's pre-backward hooks each know only their own
engine), costs one hook call and one ``register_prehook`` per tracked module
per forward (~2-3 µs), and nothing at all while grad is disabled.  Only
modules owning parameters are tracked: they are where the gradients, and the
big activation gradients, are computed.  Under FSDP1 after wrapping, the
original parameters live in the units' flat parameters, so the units are the
modules tracked.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from shardtop.probe.names import module_names

_graph_task_id: Callable[[], int] = getattr(torch._C, "_current_graph_task_id", lambda: -1)


@dataclass(frozen=True)
class TrackedModule:
    """A module the tracker names: its clean path and its type."""

    path: str
    type_name: str


def tracked_modules(root: nn.Module) -> Iterator[nn.Module]:
    """Modules owning a parameter themselves (not only through children), once each."""
    seen: set[int] = set()
    for module in root.modules():
        if id(module) in seen:
            continue
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


class ModuleTracker:
    """Knows which module's backward began last; ``install()`` before training, ``remove()`` after."""

    def __init__(self, root_module: nn.Module, names: dict[int, str] | None = None) -> None:
        self.root = root_module
        self.names = names or {}
        self._handles: list[Any] = []
        self._backward: TrackedModule | None = None
        self._types: dict[str, str] = {}

    @property
    def installed(self) -> bool:
        return bool(self._handles)

    @property
    def current_backward(self) -> str | None:
        """Path of the module whose backward began last in the running (or failed) backward."""
        entry = self._backward
        return entry.path if entry is not None else None

    def current_module(self, phase: str) -> str | None:
        """The module to blame for an OOM in ``phase``; only backward is tracked."""
        return self.current_backward if phase == "backward" else None

    def type_of(self, path: str) -> str | None:
        return self._types.get(path)

    def install(self) -> int:
        """Hook every module that owns parameters; returns how many (idempotent)."""
        if self._handles:
            return len(self._handles)
        fallback: dict[int, str] | None = None
        for module in tracked_modules(self.root):
            path = self.names.get(id(module))
            if path is None:
                if fallback is None:
                    fallback = module_names(self.root)
                path = fallback.get(id(module), "")
            entry = TrackedModule(path, type(module).__name__)
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
            if tracker._backward is not None and _graph_task_id() < 0:
                # A new forward outside any backward: the last step's answer is stale.
                # (Inside a backward it is a checkpoint recomputation: keep it.)
                tracker._backward = None
            node = first_grad_fn(output)
            if node is not None:
                node.register_prehook(backward_began)

        return after_forward
