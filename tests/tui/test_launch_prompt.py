"""The launch prompt: it offers only what it accepts, shows its answer at 80×24, and launches only what was typed."""

from __future__ import annotations

from pathlib import Path

from textual import events
from textual.widgets import Input, Static

from shardtop.config import load_preset, settable_keys
from shardtop.rundir.run_directory import list_runs
from tests.support.launch_prompt import app_at, fully_shown, open_prompt
from tests.support.waiting import settled

SMALL = (80, 24)


async def test_prompt_offers_only_keys_it_accepts(tmp_path: Path) -> None:
    app = app_at(tmp_path / "runs")
    async with app.run_test(size=SMALL) as pilot:
        prompt = await open_prompt(app, pilot, "ddp-baseline")
        offered = str(prompt.query("#launch-about Static").last().content)
        assert "on_cpu" not in offered and "program" not in offered
        for key in settable_keys(load_preset("ddp-baseline")):
            assert key in offered
        await pilot.press(*"on_cpu.model.dim=8", "enter")
        error = prompt.query_one("#launch-error", Static)
        assert "cannot be overridden" in str(error.content)
        assert list_runs(tmp_path / "runs") == []


async def test_error_is_readable_at_80x24(tmp_path: Path) -> None:
    app = app_at(tmp_path / "runs")
    async with app.run_test(size=SMALL) as pilot:
        prompt = await open_prompt(app, pilot, "ddp-baseline")  # the preset with the most keys
        await pilot.press(*"bogus=1", "enter")
        error = prompt.query_one("#launch-error", Static)
        assert "unknown key 'bogus'" in str(error.content) and "Valid keys:" in str(error.content)
        assert fully_shown(error, SMALL), (error.region, error.content_size)
        assert app.screen is prompt and list_runs(tmp_path / "runs") == []


async def test_enter_shows_what_it_will_run_before_it_runs(tmp_path: Path) -> None:
    app = app_at(tmp_path / "runs")
    async with app.run_test(size=SMALL) as pilot:
        prompt = await open_prompt(app, pilot, "fsdp2-mlp")
        command = prompt.query_one("#launch-command", Static)
        assert str(command.content) == "Enter runs: shardtop launch preset=fsdp2-mlp"
        await pilot.press(*"max_steps=7")
        assert str(command.content) == "Enter runs: shardtop launch preset=fsdp2-mlp max_steps=7"
        assert fully_shown(command, SMALL)


async def test_keys_typed_in_one_burst_act_in_order(tmp_path: Path) -> None:
    """"max_steps=3, ctrl+u, bogus=1, enter" arriving at once (a paste, tmux, a slow SSH link):
    the field must end as "bogus=1" and refuse it, not clear it late and launch the preset as it is."""
    app = app_at(tmp_path / "runs")
    async with app.run_test(size=SMALL) as pilot:
        prompt = await open_prompt(app, pilot, "ddp-baseline")
        burst = [*"max_steps=3", "ctrl+u", *"bogus=1", "enter"]
        for key in burst:
            character = {"ctrl+u": "\x15", "enter": "\r"}.get(key, key)
            name = {"=": "equals_sign", "_": "underscore"}.get(key, key)
            app.post_message(events.Key(name, character))  # no pause between keys
        await settled(pilot)
        assert app.screen is prompt, "something was launched"
        assert prompt.query_one("#overrides", Input).value == "bogus=1"
        assert "unknown key 'bogus'" in str(prompt.query_one("#launch-error", Static).content)
        assert list_runs(tmp_path / "runs") == []
