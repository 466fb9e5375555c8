"""``ConfirmScreen``: a yes/no question before anything that cannot be undone."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.screen import ModalScreen
from textual.widgets import Button, Static


class ConfirmScreen(ModalScreen[bool]):
    """Dismissed with True only by ``y`` or the confirm button; anything else cancels.

    The buttons sit side by side, confirm on the left: ← and → move between them, Enter presses
    the one in focus (Cancel, at first).
    """

    BINDINGS = [
        Binding("y", "answer(True)", "Yes"),
        Binding("n,escape", "answer(False)", "No"),
        Binding("left", "focus_button('yes')", "To the left button", show=False),
        Binding("right", "focus_button('no')", "To the right button", show=False),
    ]

    def __init__(self, question: str, detail: str = "", confirm: str = "Stop") -> None:
        super().__init__()
        self.question = question
        self.detail = detail
        self.confirm = confirm

    def compose(self) -> ComposeResult:
        with Vertical(id="dialog", classes="dialog"):
            yield Static(self.question, classes="dialog--question")
            if self.detail:
                yield Static(self.detail, classes="dialog--detail")
            with Horizontal(classes="dialog--buttons"):
                yield Button(f"{self.confirm} [y]", id="yes", variant="error")
                yield Button("Cancel [n]", id="no", variant="default")

    def on_mount(self) -> None:
        self.query_one("#no", Button).focus()

    def on_button_pressed(self, event: Button.Pressed) -> None:
        self.dismiss(event.button.id == "yes")

    def action_focus_button(self, button_id: str) -> None:
        self.query_one(f"#{button_id}", Button).focus()

    def action_answer(self, yes: bool) -> None:
        self.dismiss(yes)
