"""What autograd holds for backward, read off the graph as it stands, without changing it.

A node of the autograd graph keeps the tensors its backward needs as saved
variables.  ``node._raw_saved_<name>`` hands each one out as a ``SavedTensor``
whose ``data`` is what autograd holds (the saved tensor itself; ``None`` once
the node's backward ran and released it) without unpacking it, and whose
``unpack_hook`` says whether someone's ``saved_tensors_hooks`` (activation
checkpointing, offloading) packed it.  Reading them leaves every object as it
was: no hook is pushed, nothing is unpacked, so a custom
``autograd.Function`` still gets its own saved ``Parameter`` back (with the
attributes DeepSpeed or bitsandbytes set on it), and ``torch.func`` transforms
still run.

Each node carries its sequence number, given in creation order on its
thread: the module that was running when a node was made is the one whose
call spans that number (``ModuleSpans``).
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Iterable, Iterator
from typing import Any

import torch
from torch import nn

MAX_NODES = 2_000_000
"""A walk stops after this many nodes (a graph kept growing by mistake can be far larger than a step's)."""

sequence_number: Any = getattr(torch._C._autograd, "_get_sequence_nr", None)
"""The number the next autograd node made on this thread will get (None on a torch without it)."""


def readable() -> str | None:
    """None where saved tensors can be read without unpacking them; else why not (an older torch)."""
    probe = torch.zeros(1, requires_grad=True)
    node = (probe * probe).grad_fn
    raw = getattr(node, "_raw_saved_self", None)
    if raw is None or not hasattr(raw, "data") or not hasattr(raw, "unpack_hook"):
        return f"torch {torch.__version__} cannot read saved tensors without unpacking them"
    if sequence_number is None:
        return f"torch {torch.__version__} does not tell the sequence number of the next autograd node"
    return None


def is_parameter(tensor: torch.Tensor) -> bool:
    """``isinstance(tensor, nn.Parameter)`` without its metaclass's Python ``__instancecheck__``
    (about 20 µs a call): a plain tensor is settled by its type."""
    cls = type(tensor)
    if cls is torch.Tensor:
        return False
    if cls is nn.Parameter:
        return True
    return issubclass(cls, nn.Parameter) or bool(getattr(tensor, "_is_param", False))


def of_a_parameter(tensor: torch.Tensor) -> bool:
    """A parameter, or a view of one (``weight.t()`` saved by a Linear): not an activation."""
    if is_parameter(tensor):
        return True
    base = tensor._base
    return base is not None and is_parameter(base)


_RAW: dict[type, tuple[str, ...]] = {}


def _raw_names(node: Any) -> tuple[str, ...]:
    kind = type(node)
    names = _RAW.get(kind)
    if names is None:
        names = tuple(a for a in dir(kind) if a.startswith("_raw_saved_"))
        _RAW[kind] = names
    return names


def saved_by(node: Any) -> Iterator[torch.Tensor]:
    """The tensors ``node`` holds for its backward now, as autograd holds them.

    Saved tensors that someone's ``saved_tensors_hooks`` packed are left out:
    what they hold is the hooks' (nothing for checkpointing, host memory for
    offloading).  A custom ``autograd.Function``'s node also holds what its
    forward stored on ``ctx`` as attributes.
    """
    for name in _raw_names(node):
        try:
            raw = getattr(node, name)
        except RuntimeError:  # a Function's saved tensors after its backward released them
            return
        for saved in raw if isinstance(raw, (tuple, list)) else (raw,):
            if saved is None or saved.unpack_hook is not None:
                continue
            data = saved.data
            if isinstance(data, torch.Tensor):
                yield data
    extra = getattr(node, "__dict__", None)
    if extra:
        for value in list(extra.values()):
            if isinstance(value, torch.Tensor):
                yield value
            elif isinstance(value, (tuple, list)):
                yield from (v for v in value if isinstance(v, torch.Tensor))


def saved_results(node: Any) -> Iterator[torch.Tensor]:
    """The tensors ``node`` saved of its own output (``result``, ``result0``...): autograd holds them without
    their ``grad_fn``, so only their name tells that the node made them."""
    for name in _raw_names(node):
        if not name.startswith("_raw_saved_result"):
            continue
        try:
            raw = getattr(node, name)
        except RuntimeError:
            return
        for saved in raw if isinstance(raw, (tuple, list)) else (raw,):
            if saved is not None and saved.unpack_hook is None and isinstance(saved.data, torch.Tensor):
                yield saved.data


def nodes_from(roots: Iterable[Any]) -> Iterator[Any]:
    """Every node reachable from ``roots`` (nodes or tensors), each once, at most ``MAX_NODES``."""
    stack: list[Any] = []
    for root in roots:
        node = root.grad_fn if isinstance(root, torch.Tensor) else root
        if node is not None:
            stack.append(node)
    seen = {id(n) for n in stack}
    count = 0
    while stack and count < MAX_NODES:
        node = stack.pop()
        count += 1
        yield node
        for child, _ in node.next_functions:
            if child is not None and id(child) not in seen:
                seen.add(id(child))
                stack.append(child)


class ModuleSpans:
    """Which module was running when each autograd node was made, from the sequence numbers at each
    module call's start and end (innermost module wins; 0: no module, the script's own code)."""

    def __init__(self) -> None:
        self.starts: list[int] = []
        self.owners: list[int] = []
        self._stack: list[int] = []
        self.first: int | None = None
        """The sequence number when the spans began: nodes made before are from earlier forwards."""
        self.outermost: set[int] = set()
        """``id`` of each module called outermost (the model): its own code runs outside every other module."""
        self._enclosing: set[int] = set()
        self.enclosing = False
        """The call that returned last began before the spans did (see ``leave``)."""

    def begin(self) -> None:
        self.starts, self.owners, self._stack = [], [], []
        self.outermost, self._enclosing, self.enclosing = set(), set(), False
        self.first = sequence_number() if sequence_number is not None else None

    def enter(self, module: nn.Module) -> None:
        if sequence_number is None:
            return
        if not self._stack:
            self.outermost.add(id(module))
        self._stack.append(id(module))
        self.starts.append(sequence_number())
        self.owners.append(id(module))

    def leave(self, module: nn.Module) -> bool:
        """The call of ``module`` returned; True when it was an outermost call.

        A call that returns with none open began before the spans did: the model, whose own forward's
        pre-hook started them before any module entered.  It enclosed every call noted since: those were its
        modules, not outermost calls (``enclosing`` says so until the next call returns)."""
        self.enclosing = False
        if sequence_number is None:
            return False
        if not self._stack:
            self.enclosing = True
            self._enclosing.add(id(module))
            self.outermost = set(self._enclosing)
            self.starts.append(sequence_number())
            self.owners.append(0)
            return True
        if self._stack[-1] != id(module):
            return False
        self._stack.pop()
        self.starts.append(sequence_number())
        self.owners.append(self._stack[-1] if self._stack else 0)
        return not self._stack

    def owner(self, sequence: int) -> int:
        """``id`` of the module whose call made the node numbered ``sequence``; 0 for none."""
        i = bisect_right(self.starts, sequence) - 1
        return self.owners[i] if i >= 0 else 0

    def outside_modules(self, sequence: int) -> bool:
        """The node numbered ``sequence`` was made by no module but the outermost one's own code (the script's
        after the model returned, or a model computing its loss in its own ``forward``)."""
        owner = self.owner(sequence)
        return owner == 0 or owner in self.outermost

    def earlier(self, sequence: int) -> bool:
        """Made before the spans began (a graph kept from an earlier forward)."""
        return self.first is not None and sequence < self.first
