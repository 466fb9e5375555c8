"""ctrl+f in the launch prompt: find what fits the devices typed (``shardtop fit``).  Settings that do not say
enough get a sentence saying what to type and start nothing; good ones leave the prompt with the fit's
command (tests/engines/test_tui_fit.py starts one for real)."""

from __future__ import annotations

from pathlib import Path

from textual.widgets import Input

from shardtop.config import ConfigError, load_preset
from shardtop.tui.app import ShardtopApp
from shardtop.tui.screens.launch_prompt import (
    FitSearchRequest,
    LaunchPrompt,
    LaunchRequest,
    RehearsalRequest,
    check_fit,
)
from tests.support.launch_prompt import app_at, open_prompt, two_h200s
from tests.support.recorded import H200_HOST, RecordedHost, recorded_h200
from tests.support.waiting import settled, wait_for

SMALL = (80, 24)


def refusal(preset: str, text: str, gpus: int) -> str:
    try:
        check_fit(preset, text, lambda: gpus)
    except ConfigError as e:
        return str(e)
    raise AssertionError(f"{text!r} was taken")


def test_what_fit_needs_to_know_is_asked_for() -> None:
    assert "type the job's devices=N" in refusal("fsdp2-mlp", "max_steps=3", gpus=0)
    assert "this machine has no GPU: type the job's gpu=SIZE" in refusal("fsdp2-mlp", "devices=8", gpus=0)
    assert "has no rank to rehearse" in refusal("manual-placement", "devices=2 gpu=16GiB", gpus=0)
    assert "unknown key 'batchsize'" in refusal("fsdp2-mlp", "devices=8 gpu=16GiB batchsize=4", gpus=0)
    assert "budget=soon" in refusal("fsdp2-mlp", "devices=8 gpu=16GiB budget=soon", gpus=0)
    on_gpus = check_fit("fsdp2-mlp", "devices=8 max_steps=3", lambda: 2)
    assert on_gpus.command == "shardtop fit fsdp2-mlp devices=8 max_steps=3", "this machine's GPU is the card"
    asked = check_fit("zero3-linear-fixed", "devices=6 gpu=16GiB budget=20m", lambda: 0)
    assert asked.settings == ("zero3-linear-fixed", "devices=6", "gpu=16GiB", "budget=20m")


class Listening(ShardtopApp):
    """The app, keeping what it told the user."""

    said: list[str]

    def notify(self, message: str, **kwargs: object) -> None:
        self.said.append(message)
        super().notify(message, **kwargs)  # type: ignore[arg-type]


async def test_ctrl_f_without_the_devices_says_so_and_starts_nothing(tmp_path: Path) -> None:
    root = tmp_path / "runs"
    app = Listening(root, refresh=0.5, gpu_source=recorded_h200(), host_probe=RecordedHost(H200_HOST))  # type: ignore[arg-type]
    app.said = []
    async with app.run_test(size=SMALL) as pilot:
        prompt = await open_prompt(app, pilot, "fsdp2-mlp")
        await pilot.press(*"max_steps=2", "ctrl+f")
        await wait_for(pilot, lambda: app.said, what="the notice")
        assert app.said[-1].startswith("ctrl+f finds what fits: type the job's devices=N")
        assert app.screen is prompt and prompt.query_one("#overrides", Input).value == "max_steps=2"
    assert not (root / "fits").exists()


async def test_ctrl_f_leaves_the_prompt_with_the_fit_to_start(tmp_path: Path) -> None:
    """As on a machine with two H200s: the card is this machine's; the prompt hands the fit's settings on."""
    app = app_at(tmp_path / "runs")
    answers: list[LaunchRequest | RehearsalRequest | FitSearchRequest | None] = []
    async with app.run_test(size=SMALL) as pilot:
        await settled(pilot)
        app.push_screen(LaunchPrompt(load_preset("fsdp2-mlp"), lambda: 2, two_h200s()), answers.append)
        await pilot.pause()
        await pilot.press(*"devices=64 max_steps=2", "ctrl+f")
        await wait_for(pilot, lambda: answers, what="the prompt's answer")
    assert answers == [FitSearchRequest(("fsdp2-mlp", "devices=64", "max_steps=2"))]
    assert not (tmp_path / "runs" / "fits").exists(), "the prompt starts nothing itself: the home screen does"
