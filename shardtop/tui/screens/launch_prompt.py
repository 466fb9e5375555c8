"""``LaunchPrompt``: overrides for a preset, checked before anything starts."""

from __future__ import annotations

import shlex
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import Input, Static

from shardtop.config import ConfigError, Preset, flatten, resolve, split_overrides
from shardtop.launch import resolve_devices


@dataclass(frozen=True)
class LaunchRequest:
    """A checked launch: the resolved config and the words that produced it."""

    config: dict[str, Any]
    settings: tuple[str, ...]
    """``preset=NAME key=value ...`` as ``shardtop launch`` would take them."""


def check_launch(preset: str, text: str, gpu_count: Callable[[], int]) -> LaunchRequest:
    """The overrides typed for ``preset``, resolved; a ``ConfigError`` says what is wrong."""
    try:
        words = shlex.split(text)
    except ValueError as e:
        raise ConfigError(f"cannot read the overrides: {e}. Expected key=value pairs.") from None
    settings = (f"preset={preset}", *words)
    name, overrides = split_overrides(settings)
    if name != preset:
        raise ConfigError(f"choose another preset from the list instead of typing preset={name}.")
    config = resolve_devices(resolve(name, overrides), gpu_count)
    return LaunchRequest(config=config, settings=settings)


class LaunchPrompt(ModalScreen[LaunchRequest | None]):
    """Asks for ``key=value`` overrides; a bad one shows the error and launches nothing."""

    BINDINGS = [Binding("escape", "cancel", "Cancel")]

    def __init__(self, preset: Preset, gpu_count: Callable[[], int]) -> None:
        super().__init__()
        self.preset = preset
        self.gpu_count = gpu_count

    def compose(self) -> ComposeResult:
        keys = [k for k in flatten(dict(self.preset.defaults)) if k not in ("description", "program", "engine")]
        with Vertical(id="dialog", classes="dialog"):
            yield Static(f"Launch {self.preset.name}", classes="dialog--question")
            yield Static(self.preset.description, classes="dialog--detail")
            yield Static(f"settings: {', '.join(keys)}", classes="dialog--detail")
            yield Input(placeholder="key=value … (empty: the preset as it is)", id="overrides")
            yield Static("", id="launch-error", classes="dialog--error")
            yield Static("Enter launches · Esc cancels", classes="dialog--detail")

    def on_mount(self) -> None:
        self.query_one("#overrides", Input).focus()

    def on_input_submitted(self, event: Input.Submitted) -> None:
        event.stop()
        error = self.query_one("#launch-error", Static)
        try:
            request = check_launch(self.preset.name, event.value, self.gpu_count)
        except ConfigError as e:
            error.update(f"✗ {e}")
            error.add_class("-shown")
            return
        self.dismiss(request)

    def action_cancel(self) -> None:
        self.dismiss(None)
