"""Module paths as the user wrote them, with the engines' wrapper segments removed.

FSDP1 inserts ``_fsdp_wrapped_module``, activation checkpointing
``_checkpoint_wrapped_module``, DDP and DeepSpeed's engine ``module``, and
Lightning ``_forward_module``; a user thinks of ``transformer_0.blocks.3``, not
``_forward_module._fsdp_wrapped_module.transformer_0._fsdp_wrapped_module.blocks.3``.
"""

from __future__ import annotations

from typing import Any

WRAPPER_SEGMENTS = frozenset(
    {
        "_fsdp_wrapped_module",
        "_checkpoint_wrapped_module",
        "_forward_module",
        "_orig_mod",
    }
)
WRAPPER_ROOT_SEGMENTS = frozenset({"module"})
"""Stripped only where the module holding them is a wrapper (DDP, DeepSpeedEngine)."""

WRAPPER_TYPES = frozenset(
    {
        "FullyShardedDataParallel",
        "DistributedDataParallel",
        "DeepSpeedEngine",
        "CheckpointWrapper",
        "OptimizedModule",
        "_LightningModuleWrapperBase",
        "_FabricModule",
        "_LightningPrecisionModuleWrapperBase",
    }
)


FSDP2_CLASS = "FSDPModule"
"""The base of the classes ``fully_shard`` makes (``FSDPLinear`` for a ``Linear``)."""


def is_wrapper(module: Any) -> bool:
    """Does this module only wrap another one (its single child holds the user's module)?"""
    return any(c.__name__ in WRAPPER_TYPES for c in type(module).__mro__)


def clean_path(raw: str) -> str:
    """``_forward_module._fsdp_wrapped_module.a.module.b`` -> ``a.module.b``.

    ``module`` segments are kept here (a user may name a layer ``module``);
    ``module_names`` drops them only below a wrapper.
    """
    return ".".join(s for s in raw.split(".") if s and s not in WRAPPER_SEGMENTS)


def module_names(root: Any) -> dict[int, str]:
    """``id(module) -> clean path`` for every module under ``root``.

    A wrapper maps to the path of the module it wraps, so that a frame whose
    ``self`` is an FSDP or DDP wrapper names the user's module.
    """
    names: dict[int, str] = {}

    def visit(module: Any, path: str) -> None:
        if id(module) in names:
            return
        names[id(module)] = path
        wrapper = is_wrapper(module)
        for name, child in module.named_children():
            if wrapper or name in WRAPPER_SEGMENTS:
                visit(child, path)
            else:
                visit(child, f"{path}.{name}" if path else name)

    visit(root, "")
    return names


def user_class(cls: type) -> type:
    """The class the user wrote: FSDP2's ``fully_shard`` swaps ``Linear`` for a made-up ``FSDPLinear``."""
    mro = cls.__mro__
    if not any(c.__name__ == FSDP2_CLASS for c in mro):
        return cls
    for candidate in mro[1:]:
        if candidate.__name__ != FSDP2_CLASS and not any(c.__name__ == FSDP2_CLASS for c in candidate.__mro__):
            return candidate
    return cls


def user_type_name(module: Any) -> str:
    """The user's class name for a module: the wrapped module's for an engine wrapper (FSDP1's
    ``FullyShardedDataParallel``, DDP...), the original class for FSDP2's ``FSDP<cls>``."""
    for _ in range(8):
        child = next(iter(module.children()), None) if is_wrapper(module) else None
        if child is None:
            break
        module = child
    return user_class(type(module)).__name__
