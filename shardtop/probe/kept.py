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

A step is traced at ``FIRST_TRACE`` (warm-up over), and again whenever the
rank's memory at the start of forward has risen ``RISES_TO_TRACE`` steps in a
row by ``MIN_RISE`` or more in all, at most once every ``RETRACE_AFTER`` steps.
The hook costs a few microseconds per module call, during the traced step
only; between traces the check is one reading of memory per step.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch.multiprocessing.reductions import StorageWeakRef

from shardtop.rundir.events import Kept, KeptTensor

FIRST_TRACE = 3
"""The first step traced: after the optimizer's state and the engines' buffers were made."""
RISES_TO_TRACE = 4
MIN_RISE = 8 * 2**20
RETRACE_AFTER = 20
MAX_KEPT_ROWS = 16
"""Rows of a ``Kept`` event, largest first; the rest are summed into the total only."""


@dataclass
class _Made:
    ref: StorageWeakRef
    module: str
    module_type: str
    shape: tuple[int, ...]
    dtype: str
    nbytes: int


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

    def on_forward(self, step: int) -> Kept | None:
        self._stop_hook()  # the traced step's forward is over
        kept = None
        if self._traced_step is not None and step >= self._traced_step + 2:
            kept = self._finish()
        self._readings = (self._readings + [self.reading()])[-(RISES_TO_TRACE + 1):]
        if self._traced_step is None and self._due(step):
            self._start(step)
        return kept

    def close(self) -> None:
        self._stop_hook()
        self._made.clear()

    def _stop_hook(self) -> None:
        if self._handle is not None:
            self._handle.remove()
            self._handle = None

    def _due(self, step: int) -> bool:
        if step == FIRST_TRACE:
            return True
        r = self._readings
        rising = len(r) > RISES_TO_TRACE and all(b > a for a, b in zip(r, r[1:], strict=False))
        return rising and r[-1] - r[0] >= MIN_RISE and step - self._last_trace >= RETRACE_AFTER

    def _start(self, step: int) -> None:
        self._made.clear()
        self._traced_step = self._last_trace = step
        self._handle = torch.nn.modules.module.register_module_forward_hook(self._note)

    def _note(self, module: torch.nn.Module, inputs: Any, output: Any) -> None:
        for t in tensors_in(output):
            try:
                storage = t.untyped_storage()
                address, nbytes = storage.data_ptr(), storage.nbytes()
            except (RuntimeError, NotImplementedError):  # meta, sparse or wrapper tensors: nothing to hold
                continue
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
            )

    def _finish(self) -> Kept:
        held = set(self.held())
        rows: dict[tuple[str, str, tuple[int, ...], str], list[int]] = {}
        for address, made in self._made.items():
            if made.ref.expired() or address in held:
                continue
            row = rows.setdefault((made.module, made.module_type, made.shape, made.dtype), [0, 0])
            row[0] += made.nbytes
            row[1] += 1
        self._made.clear()
        tensors = [
            KeptTensor(module=module, module_type=kind, shape=list(shape), dtype=dtype, bytes=b, count=n)
            for (module, kind, shape, dtype), (b, n) in sorted(rows.items(), key=lambda kv: -kv[1][0])
        ]
        step, self._traced_step = self._traced_step or 0, None
        return Kept(step=step, tensors=tensors[:MAX_KEPT_ROWS], bytes=sum(t.bytes for t in tensors))
