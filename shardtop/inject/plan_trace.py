"""Trace the model the script handed its engine, on the meta device, at the batch the script passed.

``describe_call`` is what ``plan_first_call`` asks at the model's first forward
(and ``plan_only``, without a batch, at ``deepspeed.initialize``): the model's description
for the plan, with the activations one forward saves for backward when the
call's arguments are known.  The model's own tensors are swapped for meta
tensors of the same shapes and dtypes while it is traced (``on_meta``), so
nothing is allocated, not even for a model of 18 000 layers built whole, and
they are back in place afterwards.  Imported only in a rank that is planning
(torch is loaded by then).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any


def path_in(root: Any, called: Any) -> str:
    if called is root:
        return ""
    return next((name for name, m in root.named_modules() if m is called), "")


@contextlib.contextmanager
def on_meta(root: Any) -> Iterator[None]:
    """``root``'s parameters and buffers on the meta device while inside, its own tensors back afterwards.

    In place rather than a copy: a copy would also copy whatever else a module refers to (a Lightning
    module's trainer), and the plan needs only the shapes.  A ZeRO-3 partition stands for its full shape.
    """
    import torch

    metas: dict[int, Any] = {}
    saved: list[tuple[dict[str, Any], str, Any]] = []
    for module in root.modules():
        for table in (module._parameters, module._buffers):
            for name, t in table.items():
                if t is None:
                    continue
                if id(t) not in metas:
                    meta = torch.empty(tuple(getattr(t, "ds_shape", None) or t.shape), dtype=t.dtype, device="meta")
                    is_param = isinstance(t, torch.nn.Parameter)
                    metas[id(t)] = torch.nn.Parameter(meta, requires_grad=t.requires_grad) if is_param else meta
                saved.append((table, name, t))
                table[name] = metas[id(t)]
    try:
        yield
    finally:
        for table, name, t in saved:
            table[name] = t


@contextlib.contextmanager
def meta_counts_as_tracing() -> Iterator[None]:
    """transformers reads no tensor's values where it is traced (``is_tracing``: under compile, on fake
    tensors) and checks values elsewhere (``(mask == 0).all()`` to tell packed sequences apart), which a
    meta tensor cannot answer.  A meta tensor is as shapeless of values as a fake one: while inside,
    ``is_tracing`` of every transformers module loaded says so for it."""
    import sys

    patched: list[tuple[Any, Any]] = []
    for name, module in list(sys.modules.items()):
        if not name.startswith("transformers") or module is None:
            continue
        original = getattr(module, "__dict__", {}).get("is_tracing")
        if not callable(original):
            continue

        def is_tracing(tensor: Any = None, _original: Any = original) -> bool:
            return bool(getattr(tensor, "is_meta", False)) or bool(_original(tensor))

        patched.append((module, original))
        setattr(module, "is_tracing", is_tracing)  # noqa: B010 - a module attribute no stub declares
    try:
        yield
    finally:
        for module, original in patched:
            module.is_tracing = original


def describe_call(root: Any, called: Any, args: Any, kwargs: Any) -> tuple[Any, list[str]]:
    """The description of ``root`` on the meta device; with ``called`` and its arguments, its saved activations
    for that call (``called`` is ``root`` or inside it); without, none."""
    import torch
    from torch.utils._pytree import tree_flatten, tree_map

    from shardtop.plan.describe import describe_model

    notes: list[str] = []
    forward_loss = None
    batch, input_bytes = 0, 0
    if called is not None:
        path = path_in(root, called)
        leaves = [t for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)]
        batch = int(leaves[0].shape[0]) if leaves and leaves[0].dim() else 1
        input_bytes = sum(t.numel() * t.element_size() for t in leaves)
        meta_args, meta_kwargs = tree_map(
            lambda x: torch.empty(x.shape, dtype=x.dtype, device="meta") if isinstance(x, torch.Tensor) else x,
            (tuple(args), dict(kwargs or {})),
        )

        def forward_loss(model: Any) -> Any:
            target = model.get_submodule(path) if path else model
            out = target(*meta_args, **meta_kwargs)
            first = next(
                (t for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor) and t.is_floating_point()), None
            )
            return first.float().sum() if first is not None else torch.zeros((), device="meta")

        where = f"`{path}`, the first module the step called" if path else "the model"
        notes.append(f"activations traced on the meta device through {where}, at the shapes of the batch the "
                     f"script passed (first dimension {batch}, taken as the batch per rank)")
    else:
        notes.append("no forward pass was traced (the script stopped before calling the model): activations "
                     "are not planned")
    with on_meta(root), meta_counts_as_tracing(), torch.enable_grad():
        desc = describe_model(root, forward_loss, name=type(root).__name__, batch_size=batch, input_bytes=input_bytes)
    return desc, notes
