"""The probe's module hooks under ``torch.compile``: run as Python, never traced into a graph.

A compiled model's forward is traced by dynamo, hooks of its modules included.  Traced, a hook's side
effects (events written, steps counted) would run once at compile time, and some of its reads of the
probe's own state fail to trace at all.  ``eager`` marks a hook that must run on every call
(``torch.compiler.disable``: dynamo breaks the graph around it, which for the root's hooks is at the
forward's start and end only); ``compiling`` lets a hook that may skip a call do so at no cost.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any, TypeVar

F = TypeVar("F", bound=Callable[..., Any])


def eager(fn: F) -> F:
    """``fn`` run eagerly even where dynamo traces the code that calls it (``torch.compiler.disable``)."""
    torch = sys.modules.get("torch")
    disable = getattr(getattr(torch, "compiler", None), "disable", None)
    return disable(fn) if disable is not None else fn


def compiling() -> bool:
    """Is dynamo tracing this call now?  A hook that returns at once then costs the graph nothing."""
    torch = sys.modules.get("torch")
    is_compiling = getattr(getattr(torch, "compiler", None), "is_compiling", None)
    return bool(is_compiling()) if is_compiling is not None else False
