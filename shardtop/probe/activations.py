"""Activations: the tensors a forward saves for backward, live, and which module saved them.

``torch.autograd.graph.saved_tensors_hooks`` hands every tensor autograd saves
to a pack hook.  The hook wraps it in a small ``_Saved`` holder (keeping a
``detach()``ed alias, as the hook's contract asks, so no reference cycle
forms); autograd drops the holder when the node that saved it is freed,
which is right after that node's backward ran.  So the holders alive at any
moment are exactly the activations still saved, counted per storage (two
nodes saving one tensor hold it once).  Parameters are not activations: a
``Parameter`` passes through untouched, and storages a census already
counted as parameters are skipped when summing.

Which module saved a tensor: global forward pre/post hooks keep a stack of
the modules running; a tensor goes to the innermost one the first time its
storage is saved ("own only": a parent's forward does not get its children's).

The hooks cost about 5 µs per saved tensor and a hook call per module call,
so they run only while the probe explains a step (``memory_explain.py``).
Pack hooks are thread-local: ``start``/``stop`` run on the training thread.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
from torch import nn

from shardtop.probe.allocator_timeline import block_bytes
from shardtop.probe.eager import compiling


def is_parameter(tensor: torch.Tensor) -> bool:
    """``isinstance(tensor, nn.Parameter)`` without its metaclass's Python ``__instancecheck__``
    (about 20 µs a call, more than the rest of a pack hook): a plain tensor is settled by its type."""
    cls = type(tensor)
    if cls is torch.Tensor:
        return False
    if cls is nn.Parameter:
        return True
    return issubclass(cls, nn.Parameter) or bool(getattr(tensor, "_is_param", False))


class _Record:
    """One saved storage: how many holders keep it, and the module that saved it first."""

    __slots__ = ("count", "module", "storage")

    def __init__(self, storage: Any, module: int) -> None:
        self.count = 1
        self.storage = storage
        self.module = module


class _Saved:
    """What autograd keeps instead of the tensor; its death means the saved tensor was released."""

    __slots__ = ("key", "owner", "tensor")

    def __init__(self, tensor: torch.Tensor, key: int, owner: SavedActivations) -> None:
        self.tensor = tensor
        self.key = key
        self.owner = owner

    def __del__(self) -> None:
        self.owner._release(self.key)


class SavedActivations:
    """Live saved tensors of this process, per storage, with the module that saved each."""

    def __init__(self) -> None:
        self._live: dict[int, _Record] = {}
        self._stack: list[int] = []
        self._hooks: Any = None
        self._handles: list[Any] = []
        self.saved = 0
        """Tensors packed since ``start`` (a count, for the cost figures)."""
        self.failed: str | None = None
        """Why the hooks could not be pushed (``saved_tensors_hooks`` disabled by a torch feature)."""

    # -- autograd's side ----------------------------------------------------------

    def _pack(self, tensor: torch.Tensor) -> Any:
        if self._hooks is None:
            return tensor.detach()  # stopped, but left below another pair of hooks: count nothing
        if is_parameter(tensor):
            return tensor  # a leaf: no cycle, and not an activation
        base = tensor._base
        if base is not None and is_parameter(base):
            return tensor.detach()  # ``weight.t()`` saved by a Linear: a parameter still
        storage = tensor.untyped_storage()
        key = storage.data_ptr()
        if key == 0:
            return tensor.detach()
        record = self._live.get(key)
        if record is None:
            self._live[key] = _Record(storage, self._stack[-1] if self._stack else 0)
        else:
            record.count += 1
        self.saved += 1
        return _Saved(tensor.detach(), key, self)

    @staticmethod
    def _unpack(packed: Any) -> torch.Tensor:
        return packed.tensor if isinstance(packed, _Saved) else packed

    def _release(self, key: int) -> None:
        record = self._live.get(key)
        if record is not None:
            record.count -= 1
            if record.count <= 0:
                del self._live[key]

    def _enter(self, module: nn.Module, args: Any) -> None:
        if compiling():  # inside a compiled graph: what it saves is told by the module called eagerly
            return
        self._stack.append(id(module))

    def _leave(self, module: nn.Module, args: Any, output: Any) -> None:
        if compiling():
            return
        if self._stack and self._stack[-1] == id(module):
            self._stack.pop()

    # -- the probe's side ---------------------------------------------------------

    @property
    def active(self) -> bool:
        return self._hooks is not None

    def start(self) -> bool:
        """Push the pack hooks and the module hooks on this thread; False if torch refused."""
        if self._hooks is not None:
            return True
        hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack)
        try:
            hooks.__enter__()
        except RuntimeError as e:  # torch.func and some compiled regions forbid saved-tensor hooks
            self.failed = str(e).split("\n", 1)[0]
            return False
        self._hooks = hooks
        self._stack.clear()
        register = nn.modules.module
        self._handles = [
            register.register_module_forward_pre_hook(self._enter),
            register.register_module_forward_hook(self._leave, always_call=True),
        ]
        return True

    def stop(self) -> None:
        """Pop the hooks (only ours: if another pair was pushed above them, ours are left inert)."""
        for handle in self._handles:
            handle.remove()
        self._handles = []
        hooks, self._hooks = self._hooks, None
        if hooks is None:
            return
        if self._hooks_on_top():
            try:
                hooks.__exit__(None, None, None)
            except RuntimeError:
                pass

    def _hooks_on_top(self) -> bool:
        """Are our pack hooks the innermost pair (so popping pops ours)? True if torch cannot say."""
        top = getattr(torch._C._autograd, "_top_saved_tensors_default_hooks", None)
        if top is None:
            return True
        try:
            try:
                current = top(False)
            except TypeError:  # an older signature, without ``ignore_is_tracing``
                current = top()
        except RuntimeError:
            return True
        return current is None or current[0] == self._pack

    def clear(self) -> None:
        """Forget the live records (the holders still alive release nothing then)."""
        self._live = {}

    # -- what is saved now ----------------------------------------------------------

    def live_storages(self) -> list[tuple[Any, int]]:
        """(storage, module id) of every saved storage alive now; safe from another thread."""
        return [(r.storage, r.module) for r in list(self._live.values())]

    def by_module(self, device: torch.device, skip: Iterable[int] = ()) -> dict[int, int]:
        """Bytes saved and alive now per module id (on ``device``), storages in ``skip`` excluded."""
        skipped = set(skip)
        out: dict[int, int] = {}
        cuda = device.type == "cuda"
        for storage, module in self.live_storages():
            if storage.device != device:
                continue
            key = storage.data_ptr()
            nbytes = storage.nbytes()
            if key == 0 or nbytes == 0 or key in skipped:
                continue
            skipped.add(key)
            out[module] = out.get(module, 0) + block_bytes(nbytes, cuda)
        return out
