"""``LaunchPrompt``: overrides for a preset, checked before anything starts.

What Enter will do is always on screen, right under the field: the exact
``shardtop launch`` command when the overrides are good, the error when they
are not; when ``devices=`` asks for more GPUs (or CPU processes) than this
machine has, the job's rehearsal instead, one rank at a time (ctrl+r starts
``shardtop rehearse`` with the same settings); ctrl+f starts ``shardtop fit`` for the devices (and
GPU) typed: the largest micro-batch that fits, each rehearsal a run in the list.  Under it, the plan: each GPU's
predicted bar for the overrides as typed, before Enter (``PlanBars``).  The
model's description comes once per model size and batch from a helper
process (the TUI never imports torch), in a worker thread; every key after
that replans in milliseconds.  The
preset's description and settings sit below in a small scrolling box, so
the line that matters is never the one a small terminal clips.
"""

from __future__ import annotations

import shlex
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from rich.text import Text
from textual import events, work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical, VerticalScroll
from textual.message import Message
from textual.screen import ModalScreen
from textual.widgets import Input, Static
from textual.worker import Worker, WorkerState, get_current_worker

from shardtop.config import ConfigError, Preset, resolve, settable_keys, split_overrides
from shardtop.launch import TooManyDevices, rehearsal_settings, resolve_devices
from shardtop.plan.description import ModelDescription
from shardtop.plan.presets import DescriptionKey, description_key
from shardtop.rundir.memory_figures import GpuMemory
from shardtop.tui.watch import model_describer
from shardtop.tui.watch.model_describer import Described, DescribeFailed
from shardtop.tui.widgets.plan_bars import PlanBars, prompt_plan

TYPING_PAUSE_S = 0.25
"""A new model size is described once typing pauses this long: no helper process per keystroke."""


@dataclass(frozen=True)
class LaunchRequest:
    """A checked launch: the resolved config and the words that produced it."""

    config: Mapping[str, Any]
    settings: tuple[str, ...]
    """``preset=NAME key=value ...`` as ``shardtop launch`` would take them."""

    @property
    def command(self) -> str:
        return shlex.join(["shardtop", "launch", *self.settings])


@dataclass(frozen=True)
class RehearsalRequest:
    """The same settings rehearsed instead of launched: more devices than this machine has."""

    settings: tuple[str, ...]
    """``PRESET key=value ...`` (``devices=N`` among them) as ``shardtop rehearse`` takes them."""
    words: str = ""
    """What it does, in the user's words: ``rehearse the 8-GPU job on this machine's first GPU, …``."""

    @property
    def command(self) -> str:
        return shlex.join(["shardtop", "rehearse", *self.settings])


def offered_rehearsal(preset: str, text: str, refused: ConfigError) -> RehearsalRequest | None:
    """The rehearsal a refusal offers: only for ``devices=`` beyond this machine, of a preset with ranks."""
    if not isinstance(refused, TooManyDevices) or not refused.rehearsable:
        return None
    settings = tuple(rehearsal_settings((f"preset={preset}", *shlex.split(text))))
    return RehearsalRequest(settings, refused.rehearsal_words)


@dataclass(frozen=True)
class FitSearchRequest:
    """Find what fits instead of launching: ``shardtop fit`` for the preset and the devices typed."""

    settings: tuple[str, ...]
    """``PRESET devices=N gpu=… key=value ...`` as ``shardtop fit`` takes them."""

    @property
    def command(self) -> str:
        return shlex.join(["shardtop", "fit", *self.settings])


def check_fit(preset: str, text: str, gpu_count: Callable[[], int]) -> FitSearchRequest:
    """``shardtop fit``'s settings for what was typed, checked as it would check them before starting;
    a ``ConfigError`` says what is missing or wrong (devices=N, a GPU to fit on a machine without one)."""
    from shardtop.fit.request import read_fit_request

    try:
        words = shlex.split(text)
    except ValueError as e:
        raise ConfigError(f"cannot read the overrides: {e}. Expected key=value pairs.") from None
    if not any(w.partition("=")[0].strip() == "devices" for w in words):
        raise ConfigError("type the job's devices=N (and gpu=SIZE or a card) to find what fits it, e.g. "
                          "devices=8 gpu=80GB")
    request = read_fit_request((preset, *words), command=False)
    name, overrides = split_overrides(request.settings)
    config = resolve(name, overrides)
    if config.get("single_process"):
        raise ConfigError(f"{preset} drives every GPU from one process: it has no rank to rehearse, so nothing "
                          "to fit; Enter launches it.")
    if request.gpu is None and gpu_count() == 0:
        raise ConfigError("this machine has no GPU: type the job's gpu=SIZE (or a card, e.g. gpu=A100-80GB); each "
                          "rehearsed rank is then a CPU process capped at that size.")
    return FitSearchRequest((preset, *words))


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


class LaunchPrompt(ModalScreen[LaunchRequest | RehearsalRequest | FitSearchRequest | None]):
    """Asks for ``key=value`` overrides; a bad one shows the error and launches nothing; too many
    devices for this machine also offers their rehearsal (ctrl+r); ctrl+f finds what fits the devices
    typed instead (``shardtop fit``)."""

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

    BINDINGS = [
        Binding("escape", "cancel", "Cancel"),
        Binding("ctrl+r", "rehearse", "Rehearse instead"),
        Binding("ctrl+f", "fit", "Find what fits"),
    ]

    class ModelDescribed(Message):
        """The helper process answered for one model size and batch."""

        def __init__(self, key: DescriptionKey, answer: Described) -> None:
            super().__init__()
            self.key = key
            self.answer = answer

    def __init__(self, preset: Preset, gpu_count: Callable[[], int], gpus: Sequence[GpuMemory] = ()) -> None:
        super().__init__()
        self.preset = preset
        self._gpu_count = gpu_count
        self._gpus: int | None = None
        self.gpu_sizes = tuple(gpus)
        """This machine's GPUs as last sampled: what each predicted bar is judged against."""
        self._tried = False
        """Enter was pressed once: from then on errors show as the user types."""
        self._planned: Mapping[str, Any] | None = None
        """The config the plan is for (the overrides as typed, when they are good)."""
        self._describing: DescriptionKey | None = None

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
            yield PlanBars("", id="launch-plan")
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
            self.query_one(PlanBars).display = False
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
            rehearsal = offered_rehearsal(self.preset.name, self.query_one("#overrides", Input).value, result)
            if rehearsal is not None:
                command.update(
                    Text.assemble(("ctrl+r", "bold"), f": {rehearsal.words} instead: ", (rehearsal.command, "bold"))
                )
            command.display = rehearsal is not None
        else:
            error.remove_class("-shown")
            error.update("")
            command.update(f"Enter runs: {result.command}")
            command.display = True
        self._plan(result.config if isinstance(result, LaunchRequest) else None)

    # -- the plan ----------------------------------------------------------------------

    def _plan(self, config: Mapping[str, Any] | None) -> None:
        """Show the plan of ``config`` now if its model is described, else ask for the description."""
        bars = self.query_one(PlanBars)
        self._planned = config
        if config is None:
            bars.display = False
            return
        try:
            key = description_key(config)
        except ConfigError as e:
            bars.show_failed(str(e))
            return
        answer = model_describer.known(key)
        if isinstance(answer, ModelDescription):
            try:
                bars.show_plan(prompt_plan(config, answer, self.gpu_sizes))
            except Exception as e:  # noqa: BLE001 - a plan that cannot be made must not block a launch
                bars.show_failed(f"{type(e).__name__}: {e}")
        elif isinstance(answer, DescribeFailed):
            bars.show_failed(answer.reason)
        else:
            bars.show_waiting()
            if key != self._describing:
                self._describing = key
                self.describe_model(key, config)

    @work(thread=True, exclusive=True, exit_on_error=False, group="plan-describe", name="model describer")
    def describe_model(self, key: DescriptionKey, config: Mapping[str, Any]) -> None:
        worker = get_current_worker()
        time.sleep(TYPING_PAUSE_S)
        if worker.is_cancelled:
            return
        answer = model_describer.describe(config, lambda: worker.is_cancelled)
        if answer is not None:
            self.post_message(self.ModelDescribed(key, answer))

    def on_launch_prompt_model_described(self, message: ModelDescribed) -> None:
        model_describer.remember(message.key, message.answer)
        if self._describing == message.key:
            self._describing = None
        if self._planned is not None and description_key(self._planned) == message.key:
            self._plan(self._planned)

    def on_worker_state_changed(self, event: Worker.StateChanged) -> None:
        """A describer that broke says why, in one line, instead of waiting for ever."""
        if event.worker.group == "plan-describe" and event.state == WorkerState.ERROR:
            self._describing = None
            error = event.worker.error
            self.query_one(PlanBars).show_failed(f"{type(error).__name__}: {error}")

    def action_rehearse(self) -> None:
        """Rehearse the settings typed, where they ask for more devices than this machine has."""
        text = self.query_one("#overrides", Input).value
        result = self._check(text)
        rehearsal = offered_rehearsal(self.preset.name, text, result) if isinstance(result, ConfigError) else None
        if rehearsal is None:
            self.notify("ctrl+r rehearses a job larger than this machine: type devices=N with more devices than "
                        "it has (Enter launches what fits).")
            return
        self.dismiss(rehearsal)

    def action_fit(self) -> None:
        """Find the largest micro-batch that fits the devices typed, where the settings say enough."""
        try:
            request = check_fit(self.preset.name, self.query_one("#overrides", Input).value, self.gpu_count)
        except ConfigError as e:
            self.notify(f"ctrl+f finds what fits: {e}", severity="warning", timeout=8)
            return
        self.dismiss(request)

    def action_cancel(self) -> None:
        self.dismiss(None)
