"""Tensors kept across steps: what one step's forward made that is still alive when the next one begins.

A list that collects each step's logits, a forward hook that appends a layer's
activations: such tensors outlive their step, and memory climbs by their size
every step until the rank runs out.  To name them, one step is traced now and
then: a global forward hook notes, for every tensor a module returns, its
storage (weakly), the innermost module that returned it, its shape and dtype.
When the forward of the step after next begins, the storages still alive are
the kept ones (parameters and buffers left out), summed by module, shape and
dtype, and written as one ``Kept`` event.  The step after next, not the next:
a loop's own variable (``out = model(x)``) still holds the last step's output
when the next forward begins, and lets go of it once that forward returns.

Once a traced step found a module's outputs kept, that module's outputs are
followed from then on (a hook on it alone, ``FOLLOW_AT_MOST`` modules): every
census counts those still alive from an earlier step as "kept from earlier
steps", so the memory split names what grows (``kept_storages``).

The first step is traced, and again whenever the rank's memory at the start
of forward has risen ``RISES_TO_TRACE`` steps in a row by ``MIN_RISE`` or more
in all, at most once every ``RETRACE_AFTER`` steps.  The global hook costs a
few microseconds per module call, during the traced step and the next (whose
outputs of the modules found keeping are followed too, so that no step's kept
tensors go unseen); between traces the check is one reading of memory per
step, and a followed module's hook one note per call.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch.multiprocessing.reductions import StorageWeakRef

from shardtop.probe.eager import compiling
from shardtop.rundir.events import Kept, KeptTensor

RISES_TO_TRACE = 4
MIN_RISE = 8 * 2**20
RETRACE_AFTER = 20
MAX_KEPT_ROWS = 16
"""Rows of a ``Kept`` event, largest first; the rest are summed into the total only."""
FOLLOW_AT_MOST = 8
"""Modules whose kept outputs are followed, the largest first."""
FOLLOW_FROM = 1 << 20
"""A module's kept outputs are followed from this many bytes in the traced step."""


@dataclass
class _Made:
    ref: StorageWeakRef
    module: str
    module_type: str
    shape: tuple[int, ...]
    dtype: str
    nbytes: int
    device: int = -1
    step: int = 0
    module_ref: Any = None
    """A weak reference to the module that returned it."""


@dataclass(frozen=True)
class _Followed:
    ref: StorageWeakRef
    nbytes: int
    device: int
    """``Tensor.get_device()``: -1 on the CPU."""
    step: int


def tensors_in(value: Any) -> Iterator[torch.Tensor]:
    """The tensors of a module's output: a tensor, or one inside tuples, lists and dicts (HF outputs)."""
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, (tuple, list)):
        for item in value:
            yield from tensors_in(item)
    elif isinstance(value, dict):
        for item in value.values():
            yield from tensors_in(item)


def storages_in(value: Any) -> Iterator[tuple[torch.Tensor, Any, int, int]]:
    """(tensor, storage, address, bytes) of each tensor of a module's output that has a storage."""
    for t in tensors_in(value):
        try:
            storage = t.untyped_storage()
            yield t, storage, storage.data_ptr(), storage.nbytes()
        except (RuntimeError, NotImplementedError):  # meta, sparse or wrapper tensors: nothing to hold
            continue


def held_storages(root: Any) -> set[int]:
    """Addresses of the storages of ``root``'s parameters, their gradients and its buffers."""
    held: set[int] = set()
    if not isinstance(root, torch.nn.Module):
        return held
    for tensor in (*root.parameters(), *root.buffers()):
        for t in (tensor, getattr(tensor, "grad", None)):
            if isinstance(t, torch.Tensor):
                try:
                    held.add(t.untyped_storage().data_ptr())
                except (RuntimeError, NotImplementedError):
                    pass
    return held


class KeptTracker:
    """Traces one step now and then; ``on_forward`` at each step's forward returns a ``Kept`` once a
    traced step is over."""

    def __init__(self, names: dict[int, str], reading: Callable[[], int], held: Callable[[], Iterable[int]]) -> None:
        """``names``: id(module) -> tree path; ``reading``: the rank's memory now (allocated, or RSS on
        CPU); ``held``: storage addresses of parameters, buffers and gradients, never "kept"."""
        self.names = names
        self.reading = reading
        self.held = held
        self._made: dict[int, _Made] = {}
        self._handle: Any = None
        self._traced_step: int | None = None
        self._last_trace = -RETRACE_AFTER
        self._readings: list[int] = []
        self._step = 0
        self._follow_handles: dict[int, Any] = {}
        """id(module) -> the hook that follows its outputs."""
        self._followed: dict[int, _Followed] = {}

    def on_forward(self, step: int) -> Kept | None:
        self._step = step
        if self._followed:
            self._followed = {a: f for a, f in self._followed.items() if not f.ref.expired()}
        kept = None
        traced = self._traced_step
        if traced is not None and not traced <= step < traced + 2:
            self._stop_hook()  # the traced step's forward and the next one are over
            if step >= traced + 2:
                kept = self._finish()
            else:
                self._abandon()
        self._readings = (self._readings + [self.reading()])[-(RISES_TO_TRACE + 1):]
        if self._traced_step is None and self._due(step):
            self._start(step)
        return kept

    def _abandon(self) -> None:
        """The step counter went back (a new run in the same process): nothing traced can be judged."""
        self._made.clear()
        self._traced_step = None

    @property
    def following(self) -> bool:
        """Are some modules' outputs followed (so that a census can count kept tensors)?"""
        return bool(self._follow_handles)

    def kept_storages(self) -> list[tuple[int, int, int]]:
        """(address, bytes, device) of the followed outputs still alive that an earlier step made."""
        return [
            (address, f.nbytes, f.device)
            for address, f in list(self._followed.items())
            if f.step < self._step and not f.ref.expired()
        ]

    def close(self) -> None:
        self._stop_hook()
        self._made.clear()
        for handle in self._follow_handles.values():
            handle.remove()
        self._follow_handles.clear()
        self._followed.clear()

    def _stop_hook(self) -> None:
        if self._handle is not None:
            self._handle.remove()
            self._handle = None

    def _due(self, step: int) -> bool:
        if self._last_trace < 0:  # never traced: the first step is
            return True
        r = self._readings
        rising = len(r) > RISES_TO_TRACE and all(b > a for a, b in zip(r, r[1:], strict=False))
        return rising and r[-1] - r[0] >= MIN_RISE and step - self._last_trace >= RETRACE_AFTER

    def _start(self, step: int) -> None:
        self._made.clear()
        self._traced_step = self._last_trace = step
        self._handle = torch.nn.modules.module.register_module_forward_hook(self._note)

    def _note(self, module: torch.nn.Module, inputs: Any, output: Any) -> None:
        if compiling():  # inside a compiled graph: its outputs are seen where the compiled module returns
            return
        for t, storage, address, nbytes in storages_in(output):
            earlier = self._made.get(address)
            if nbytes == 0 or (earlier is not None and not earlier.ref.expired()):
                continue  # the innermost module that returned it was noted first
            self._made[address] = _Made(
                ref=StorageWeakRef(storage),
                module=self.names.get(id(module), ""),
                module_type=type(module).__name__,
                shape=tuple(t.shape),
                dtype=str(t.dtype).removeprefix("torch."),
                nbytes=nbytes,
                device=t.get_device(),
                step=self._step,
                module_ref=weakref.ref(module),
            )

    def _follow(self, module: torch.nn.Module, inputs: Any, output: Any) -> None:
        if compiling():
            return
        for t, storage, address, nbytes in storages_in(output):
            if nbytes and address not in self._followed:
                self._followed[address] = _Followed(StorageWeakRef(storage), nbytes, t.get_device(), self._step)

    def _follow_modules(self, made: Iterable[_Made]) -> None:
        by_module: dict[int, list[Any]] = {}
        for m in made:
            module = m.module_ref() if m.module_ref is not None else None
            if module is not None:
                by_module.setdefault(id(module), [module, 0])[1] += m.nbytes
        ranked = sorted(by_module.items(), key=lambda kv: -kv[1][1])
        for key, (module, nbytes) in ranked:
            if len(self._follow_handles) >= FOLLOW_AT_MOST or nbytes < FOLLOW_FROM:
                break
            if key not in self._follow_handles:
                self._follow_handles[key] = module.register_forward_hook(self._follow)

    def _finish(self) -> Kept:
        held = set(self.held())
        rows: dict[tuple[str, str, tuple[int, ...], str], list[int]] = {}
        kept: list[_Made] = []
        traced = self._traced_step or 0
        for address, made in self._made.items():
            if made.ref.expired() or address in held or made.step != traced:
                continue
            kept.append(made)
            self._followed.setdefault(address, _Followed(made.ref, made.nbytes, made.device, made.step))
            row = rows.setdefault((made.module, made.module_type, made.shape, made.dtype), [0, 0])
            row[0] += made.nbytes
            row[1] += 1
        self._follow_modules(kept)
        followed = {id(m) for m in (made.module_ref() for made in kept if made.module_ref is not None) if m is not None}
        for address, made in self._made.items():  # the next step's outputs of those modules: followed too
            module = made.module_ref() if made.module_ref is not None else None
            if made.step != traced and id(module) in followed and not made.ref.expired() and address not in held:
                self._followed.setdefault(address, _Followed(made.ref, made.nbytes, made.device, made.step))
        self._made.clear()
        tensors = [
            KeptTensor(module=module, module_type=kind, shape=list(shape), dtype=dtype, bytes=b, count=n)
            for (module, kind, shape, dtype), (b, n) in sorted(rows.items(), key=lambda kv: -kv[1][0])
        ]
        step, self._traced_step = self._traced_step or 0, None
        return Kept(step=step, tensors=tensors[:MAX_KEPT_ROWS], bytes=sum(t.bytes for t in tensors))
