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
    A parameter's stand-in carries what was set on the parameter (DeepSpeed's ``ds_*``, a library's own
    marks), so the script's forward finds them; a ZeRO-3 parameter's reads gathered, as in a forward.
    """
    import torch

    metas: dict[int, Any] = {}
    saved: list[tuple[dict[str, torch.Tensor | None], str, torch.Tensor]] = []
    for module in root.modules():
        for table in (module._parameters, module._buffers):
            for name, t in table.items():
                if t is None:
                    continue
                if id(t) not in metas:
                    meta = torch.empty(tuple(getattr(t, "ds_shape", None) or t.shape), dtype=t.dtype, device="meta")
                    metas[id(t)] = _stand_in(t, meta) if isinstance(t, torch.nn.Parameter) else meta
                saved.append((table, name, t))
                table[name] = metas[id(t)]
    try:
        yield
    finally:
        for table, name, t in saved:
            table[name] = t


def _stand_in(param: Any, meta: Any) -> Any:
    import torch

    stand_in = torch.nn.Parameter(meta, requires_grad=param.requires_grad)
    stand_in.__dict__.update(getattr(param, "__dict__", {}))
    status = getattr(param, "ds_status", None)
    available = getattr(type(status), "AVAILABLE", None)
    if available is not None:
        setattr(stand_in, "ds_status", available)  # noqa: B010 - an attribute torch does not declare
    return stand_in


@contextlib.contextmanager
def autocast_as_on(device_type: str) -> Iterator[None]:
    """``torch.is_autocast_enabled`` and ``torch.get_autocast_dtype`` asked of the meta device answer for
    ``device_type``, the device the job runs on: a forward that picks its compute dtype from the device
    of its tensors (TRL's chunked loss) asks them of the meta device while it is traced."""
    import torch

    originals = {name: getattr(torch, name, None) for name in ("is_autocast_enabled", "get_autocast_dtype")}

    def for_device(original: Any) -> Any:
        def asked(*args: Any, **kwargs: Any) -> Any:
            if args and args[0] == "meta":
                args = (device_type, *args[1:])
            return original(*args, **kwargs)

        return asked

    for name, original in originals.items():
        if original is not None:
            setattr(torch, name, for_device(original))
    try:
        yield
    finally:
        for name, original in originals.items():
            if original is not None:
                setattr(torch, name, original)


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


def describe_call(root: Any, called: Any, args: Any, kwargs: Any,
                  not_traced: str = "the script stopped before calling the model") -> tuple[Any, list[str]]:
    """The description of ``root`` on the meta device; with ``called`` and its arguments, its saved activations
    for that call (``called`` is ``root`` or inside it); without, none, and a note that says why
    (``not_traced``)."""
    import torch
    from torch.utils._pytree import tree_flatten, tree_map

    from shardtop.trace.describe import describe_model

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
        notes.append(f"no forward pass was traced: {not_traced}; activations are not planned")
    device_type = next((p.device.type for p in root.parameters() if p.device.type != "meta"), "cpu")
    autocast = called is not None and _autocast_enabled(device_type)
    with on_meta(root), meta_counts_as_tracing(), autocast_as_on(device_type), torch.enable_grad():
        desc = describe_model(root, forward_loss, name=type(root).__name__, batch_size=batch, input_bytes=input_bytes,
                              autocast=autocast)
    if autocast and desc.saved_autocast_upto:
        notes.append("the call ran under autocast: its activations were traced again with autocast's casts, "
                     "each saved tensor counted in the dtype autocast gives it")
    elif autocast:
        notes.append("the call ran under autocast, but its forward could not be traced with autocast's casts: "
                     "mixed precision counts each saved element at 2 bytes")
    return desc, notes


def _autocast_enabled(device_type: str) -> bool:
    """The script's forward runs under ``torch.autocast`` for its device (Lightning's and accelerate's mixed
    precision): the plan then counts what it saves as autocast casts it."""
    import torch

    try:
        return bool(torch.is_autocast_enabled(device_type))
    except (TypeError, RuntimeError):  # a torch whose is_autocast_enabled takes no device
        return False
