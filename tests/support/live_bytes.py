"""Bytes of the live tensor storages of real CPU tensors, and their peak: what a step holds, counted exactly."""

from __future__ import annotations

import weakref
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten


class LiveBytes(TorchDispatchMode):
    """Bytes of live tensor storages on real CPU tensors, and their peak."""

    def __init__(self) -> None:
        super().__init__()
        self.live = self.peak = 0
        self.sizes: dict[int, int] = {}

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor):
                storage = t.untyped_storage()
                key = id(storage)
                if key not in self.sizes:
                    self.sizes[key] = storage.nbytes()
                    self.live += self.sizes[key]
                    weakref.finalize(storage, self._free, key)
        self.peak = max(self.peak, self.live)
        return out

    def _free(self, key: int) -> None:
        self.live -= self.sizes.pop(key)


class LiveStorageBytes(TorchDispatchMode):
    """Bytes of the live storages of the tensors the ops made, at their size after each op, and the peak of
    each phase the caller names.

    For FSDP2: it frees and makes again its whole parameters by resizing their storages in place
    (``untyped_storage().resize_``), which no op reports, and its parameters and gradients are DTensors,
    whose local tensors hold the storage.  Storages a collective makes inside the process group (gloo's own
    copies) are not counted: the engine's tensors are."""

    def __init__(self) -> None:
        super().__init__()
        self.storages: dict[int, weakref.ref[torch.UntypedStorage]] = {}
        self.phase = "set-up"
        self.peaks: dict[str, int] = {}

    def _track(self, tensor: torch.Tensor) -> None:
        from torch.distributed.tensor import DTensor

        local = tensor._local_tensor if isinstance(tensor, DTensor) else tensor
        storage = local.untyped_storage()
        key = id(storage)
        if key not in self.storages:
            self.storages[key] = weakref.ref(storage)
            weakref.finalize(storage, self.storages.pop, key, None)

    @property
    def live(self) -> int:
        return sum(s.nbytes() for s in (ref() for ref in list(self.storages.values())) if s is not None)

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor) and t.device.type != "meta":
                self._track(t)
        self.peaks[self.phase] = max(self.peaks.get(self.phase, 0), self.live)
        return out
