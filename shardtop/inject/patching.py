"""Replacing a function of another library once, for a rehearsal, and never twice.

A replaced function carries a mark (``PATCHED``): replacing it again, when a
library is imported a second way or a patch runs twice, leaves it as it is.
Nothing here imports torch or any library it patches.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Callable
    from types import ModuleType

PATCHED = "__shardtop_rehearsal__"


def once(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn``, marked as shardtop's own replacement."""
    setattr(fn, PATCHED, True)
    return fn


def replace(owner: ModuleType | type, name: str, make: Callable[[Callable[..., Any]], Callable[..., Any]]) -> None:
    """``owner.name`` replaced by ``make(original)``, unless it is missing or already replaced."""
    original = getattr(owner, name, None)
    if original is None or getattr(original, PATCHED, False):
        return
    setattr(owner, name, once(functools.wraps(original)(make(original))))
