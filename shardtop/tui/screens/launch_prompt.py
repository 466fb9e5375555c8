"""``LaunchPrompt``: overrides for a preset, checked before anything starts.

What Enter will do is always on screen, right under the field: the exact
``shardtop launch`` command when the overrides are good, the error when they
are not.  The preset's description and settings sit below in a small
scrolling box, so the line that matters is never the one a small terminal
clips.
"""

from __future__ import annotations

import shlex
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from textual import events
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Input, Static

from shardtop.config import ConfigError, Preset, resolve, settable_keys, split_overrides
from shardtop.launch import resolve_devices


@dataclass(frozen=True)
class LaunchRequest:
    """A checked launch: the resolved config and the words that produced it."""

    config: dict[str, Any]
    settings: tuple[str, ...]
    """``preset=NAME key=value ...`` as ``shardtop launch`` would take them."""

    @property
    def command(self) -> str:
        return shlex.join(["shardtop", "launch", *self.settings])


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


def _input_actions() -> dict[str, str]:
    """Each key the text field binds, with its action: ``{"ctrl+u": "delete_left_all", …}``."""
    actions: dict[str, str] = {}
    for binding in Input.BINDINGS:
        keys, action = (binding.key, binding.action) if isinstance(binding, Binding) else binding[:2]
        for key in keys.split(","):
            actions[key.strip()] = action
    return actions


class OverridesInput(Input):
    """A text field whose editing keys act in the order they were typed.

    Textual runs a widget's key bindings once the key has bubbled up to the
    app, but inserts printable keys at once.  Typed in one burst (a paste,
    tmux, an SSH link that batches keys), "max_steps=3 ctrl+u bogus=1 enter"
    became "max_steps=3bogus=1", then ctrl+u cleared it all, then Enter
    submitted an empty field and launched the preset as it is.  Here the
    field's own bindings run as their key arrives.
    """

    ACTIONS = _input_actions()

    async def on_key(self, event: events.Key) -> None:
        action = self.ACTIONS.get(event.key)
        if action is not None:
            event.prevent_default()
            event.stop()
            await self.run_action(action)


class LaunchPrompt(ModalScreen[LaunchRequest | None]):
    """Asks for ``key=value`` overrides; a bad one shows the error and launches nothing."""

    DEFAULT_CSS = """
    LaunchPrompt #launch-about {
        height: auto;
        max-height: 4;
        margin-top: 1;
    }
    LaunchPrompt #launch-command {
        color: $text-muted;
    }
    """

    BINDINGS = [Binding("escape", "cancel", "Cancel")]

    def __init__(self, preset: Preset, gpu_count: Callable[[], int]) -> None:
        super().__init__()
        self.preset = preset
        self._gpu_count = gpu_count
        self._gpus: int | None = None
        self._tried = False
        """Enter was pressed once: from then on errors show as the user types."""

    def gpu_count(self) -> int:
        """Asked once per prompt: the check runs on every key."""
        if self._gpus is None:
            self._gpus = self._gpu_count()
        return self._gpus

    def compose(self) -> ComposeResult:
        keys = settable_keys(self.preset)
        with Vertical(id="dialog", classes="dialog"):
            yield Static(
                f"Launch {self.preset.name}  ·  Enter launches, Esc cancels", classes="dialog--question", markup=False
            )
            yield OverridesInput(placeholder="key=value … (empty: the preset as it is)", id="overrides")
            # what the user typed is echoed in these: never read as markup
            yield Static("", id="launch-error", classes="dialog--error", markup=False)
            yield Static("", id="launch-command", markup=False)
            with VerticalScroll(id="launch-about", can_focus=False):
                yield Static(self.preset.description, classes="dialog--detail", markup=False)
                yield Static(f"settings: {', '.join(keys)}", classes="dialog--detail", markup=False)

    def on_mount(self) -> None:
        self.query_one("#overrides", Input).focus()
        self._show(self._check(""))

    def on_input_changed(self, event: Input.Changed) -> None:
        event.stop()
        result = self._check(event.value)
        if isinstance(result, ConfigError) and not self._tried:
            self.query_one("#launch-command", Static).display = False
            return
        self._show(result)

    def on_input_submitted(self, event: Input.Submitted) -> None:
        event.stop()
        self._tried = True
        result = self._check(event.value)  # the text as it was at Enter, not keys typed after it
        self._show(result)
        if isinstance(result, LaunchRequest):
            self.dismiss(result)

    def _check(self, text: str) -> LaunchRequest | ConfigError:
        try:
            return check_launch(self.preset.name, text, self.gpu_count)
        except ConfigError as e:
            return e

    def _show(self, result: LaunchRequest | ConfigError) -> None:
        error = self.query_one("#launch-error", Static)
        command = self.query_one("#launch-command", Static)
        if isinstance(result, ConfigError):
            error.update(f"✗ {result}")
            error.add_class("-shown")
            command.display = False
        else:
            error.remove_class("-shown")
            error.update("")
            command.update(f"Enter runs: {result.command}")
            command.display = True

    def action_cancel(self) -> None:
        self.dismiss(None)
