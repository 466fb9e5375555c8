"""The keys a new user tries first: ``p`` to the presets, arrows to the one wanted, Enter; ← and → in the
stop dialog."""

from __future__ import annotations

from pathlib import Path

from textual.app import App
from textual.widgets import Button

from shardtop.tui.screens.confirm import ConfirmScreen
from shardtop.tui.screens.launch_prompt import LaunchPrompt
from shardtop.tui.widgets.preset_list import PresetList
from tests.support.apps import app_for
from tests.support.footer import footer_keys
from tests.support.waiting import settled, wait_for


async def test_p_is_in_the_footer_and_highlights_the_preset_enter_opens(recorded_root: Path) -> None:
    app = app_for(recorded_root)
    async with app.run_test(size=(120, 40)) as pilot:
        presets = app.screen.query_one(PresetList)
        await wait_for(pilot, lambda: presets.option_count > 3, what="the presets")
        await settled(pilot)
        assert "p Presets" in footer_keys(app), "the key that moves to the presets is said"
        await pilot.press("p")
        assert presets.has_focus
        assert presets.highlighted == 0, "the first preset is highlighted as soon as the list has the focus"
        names = [presets.get_option_at_index(i).id for i in range(presets.option_count)]
        await pilot.press("down", "down", "down")
        assert presets.selected == names[3], "three ↓ from the first: the fourth"
        await pilot.press("enter")
        await wait_for(pilot, lambda: isinstance(app.screen, LaunchPrompt), what="the launch prompt")
        assert app.screen.preset.name == names[3], "Enter opens the highlighted preset"  # type: ignore[attr-defined]


class _Asks(App[None]):
    """An app that asks one question and keeps the answer."""

    def __init__(self) -> None:
        super().__init__()
        self.answers: list[bool | None] = []

    def on_mount(self) -> None:
        self.push_screen(ConfirmScreen("Stop run x?", "Its processes get SIGTERM."), self.answers.append)


async def test_left_and_right_move_between_the_stop_dialogs_buttons() -> None:
    app = _Asks()
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.pause()
        assert isinstance(app.focused, Button) and app.focused.id == "no", "Cancel has the focus first"
        await pilot.press("left")
        assert isinstance(app.focused, Button) and app.focused.id == "yes", "← goes to Stop"
        await pilot.press("left")
        assert app.focused.id == "yes", "and stays there"
        await pilot.press("right")
        assert app.focused.id == "no", "→ goes back to Cancel"
        await pilot.press("left", "enter")
        await pilot.pause()
        assert app.answers == [True], "Enter on Stop stops"
