"""Checkpointed regions seen while a forward is traced: what each would save if it were not checkpointed.

``torch.utils.checkpoint`` keeps a region's inputs and drops what it saves,
to recompute it in the backward; the backward then holds all of it at once
while it makes the region's gradients.  While tracing (never in a real run),
``checkpoints_measured`` hands each region's saves to the profiler as well.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import torch


@dataclass(frozen=True)
class Saved:
    """Floating elements and other bytes saved for backward."""

    floats: int = 0
    other: int = 0

    @property
    def size(self) -> int:
        """Its bytes at four bytes an element: which of two is the larger."""
        return self.floats * 4 + self.other

    def plus(self, floating: bool, amount: int) -> Saved:
        """These and ``amount`` more: elements if ``floating``, else bytes."""
        return Saved(self.floats + amount, self.other) if floating else Saved(self.floats, self.other + amount)


@dataclass(frozen=True)
class Recomputed(Saved):
    """What one checkpointed region saves when it is not checkpointed, and the largest output of a module
    inside it (elements)."""

    largest_output: int = 0


class Regions(Protocol):
    """What counts the saves: the profiler, which keeps a region's apart from the forward's own."""

    def pack(self, t: torch.Tensor) -> torch.Tensor: ...

    def open_region(self, held: Sequence[Any] = ()) -> None: ...

    def close_region(self) -> None: ...


@contextlib.contextmanager
def checkpoints_measured(profiler: Regions) -> Iterator[None]:
    """Each region ``torch.utils.checkpoint`` runs while inside is also counted as if not checkpointed.

    Non-reentrant (transformers' default, ``checkpoint_wrapper``'s, the composable ``checkpoint``): all go
    through ``_checkpoint_hook``, the saved-tensor hooks that take the region's saves; each save is counted
    into the region before checkpoint takes it.  Reentrant: the region runs without gradients, saving
    nothing, so it is run once more with them, on the meta device, to count what it saves.  The traced
    forward's own counts are unchanged: the region's saves never reach the rows.
    """
    from torch.utils import checkpoint as torch_checkpoint

    hook_class: Any = getattr(torch_checkpoint, "_checkpoint_hook", None)
    function: Any = getattr(torch_checkpoint, "CheckpointFunction", None)
    patched: list[tuple[Any, str, Any]] = []
    if isinstance(hook_class, type):

        class MeasuredHook(hook_class):  # type: ignore[misc]
            def __init__(self, frame: Any) -> None:
                super().__init__(frame)
                checkpoint_pack: Callable[[torch.Tensor], Any] = getattr(self, "pack_hook")  # noqa: B009 - untyped in torch

                def pack(x: torch.Tensor) -> Any:
                    profiler.pack(x)
                    return checkpoint_pack(x)

                self.pack_hook = pack

            def __enter__(self) -> None:
                profiler.open_region()
                super().__enter__()

            def __exit__(self, *args: object) -> None:
                super().__exit__(*args)
                profiler.close_region()

        patched.append((torch_checkpoint, "_checkpoint_hook", hook_class))
        setattr(torch_checkpoint, "_checkpoint_hook", MeasuredHook)  # noqa: B010 - a private name no stub declares
    if function is not None and "forward" in vars(function):
        forward = vars(function)["forward"]
        checkpoint_forward = forward.__func__ if isinstance(forward, staticmethod) else forward

        def measured_forward(ctx: Any, run_function: Callable[..., Any], preserve_rng_state: bool,
                             *args: Any) -> Any:
            out = checkpoint_forward(ctx, run_function, preserve_rng_state, *args)
            profiler.open_region(held=args)
            try:
                with torch.enable_grad(), torch.autograd.graph.saved_tensors_hooks(profiler.pack, unpacked):
                    run_function(*torch_checkpoint.detach_variable(tuple(args)))
            finally:
                profiler.close_region()
            return out

        patched.append((function, "forward", forward))
        function.forward = staticmethod(measured_forward)
    try:
        yield
    finally:
        for owner, name, original in reversed(patched):
            setattr(owner, name, original)


def unpacked(t: torch.Tensor) -> torch.Tensor:
    """The unpack hook of a trace: the saved tensor itself."""
    return t
