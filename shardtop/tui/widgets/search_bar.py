"""``SearchBar``: the ``/`` prompt that finds modules by path."""

from __future__ import annotations

from textual.binding import Binding
from textual.message import Message
from textual.widgets import Input


class SearchBar(Input):
    """Type part of a module path; Enter keeps the matches (n / N step), Escape closes."""

    BINDINGS = [Binding("escape", "close", "Close search")]

    DEFAULT_CSS = """
    SearchBar {
        display: none;
        dock: bottom;
    }
    SearchBar.-open {
        display: block;
    }
    """

    class Closed(Message):
        """The search bar was closed (Enter or Escape)."""

    def __init__(self, id: str | None = None) -> None:
        super().__init__(placeholder="search module paths (Enter: keep, n/N: next/previous, Esc: close)", id=id)

    def open(self) -> None:
        self.add_class("-open")
        self.focus()

    def action_close(self) -> None:
        self.remove_class("-open")
        self.post_message(self.Closed())

    async def action_submit(self) -> None:
        await super().action_submit()
        self.action_close()
