"""Driving the launch prompt: opening it from the home screen, or as on a machine with two H200s."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from textual.widgets import Static

from shardtop.config import load_preset
from shardtop.tui.app import ShardtopApp
from shardtop.tui.screens.home import ControlledHomeScreen
from shardtop.tui.screens.launch_prompt import LaunchPrompt
from tests.support.recorded import H200_HOST, RecordedHost, recorded_h200
from tests.support.waiting import settled


def app_at(root: Path) -> ShardtopApp:
    return ShardtopApp(root, refresh=0.5, gpu_source=recorded_h200(), host_probe=RecordedHost(H200_HOST))  # type: ignore[arg-type]


async def open_prompt(app: ShardtopApp, pilot: Any, preset: str) -> LaunchPrompt:
    await settled(pilot)
    home = app.screen
    assert isinstance(home, ControlledHomeScreen)
    home.action_launch(preset)
    await pilot.pause()
    assert isinstance(app.screen, LaunchPrompt)
    return app.screen


def two_h200s() -> list[Any]:
    first = recorded_h200().sample()[0]
    return [first, first]


async def gpu_prompt(app: ShardtopApp, pilot: Any, preset: str) -> LaunchPrompt:
    """The prompt as on a machine with two H200s (the home screen hands it the GPUs it sampled)."""
    await settled(pilot)
    prompt = LaunchPrompt(load_preset(preset), lambda: 2, two_h200s())
    app.push_screen(prompt)
    await pilot.pause()
    return prompt


def fully_shown(widget: Static, screen_size: tuple[int, int]) -> bool:
    """Every line of the widget's text lies inside its dialog and on the screen."""
    dialog = widget.screen.query_one("#dialog")
    width, height = screen_size
    region = widget.region
    lines = widget.content_size.height
    return (
        region.height >= lines > 0
        and dialog.content_region.contains_region(region)
        and region.right <= width and region.bottom <= height
    )
