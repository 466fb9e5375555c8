"""One guard for the handlers of a feed's messages: none runs once its screen has left the app."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import TypeVar

from textual.message import Message
from textual.screen import Screen

S = TypeVar("S", bound=Screen[None])
M = TypeVar("M", bound=Message)


def while_attached(handler: Callable[[S, M], None]) -> Callable[[S, M], None]:
    """``handler``, run only while its screen is attached to the app.

    A feed's thread posts its messages until it sees that it should stop; when
    the app quits, the last of them finds no screen to show it on, and is
    dropped here.
    """

    @functools.wraps(handler)
    def guarded(screen: S, message: M) -> None:
        if screen.is_attached:
            handler(screen, message)

    return guarded
