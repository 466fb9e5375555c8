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
