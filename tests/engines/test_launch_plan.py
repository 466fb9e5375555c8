"""The launch prompt's plan: each GPU's predicted bar for the overrides as typed, before Enter.

The model's description comes from the real helper process (``python -m
shardtop.trace``: torch, the meta device); the TUI itself replans on every key.
The GPUs are the recorded H200's (two of them, as on the recording machine);
on this machine, without GPUs, the same prompt plans CPU processes.  In tests/engines: each
description starts that helper, which imports torch (seconds on 2 cores).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from textual.widgets import Input

from shardtop.rundir.run_directory import list_runs
from shardtop.tui.app import ShardtopApp
from shardtop.tui.screens.launch_prompt import LaunchPrompt
from shardtop.tui.watch import model_describer
from shardtop.tui.widgets.plan_bars import PlanBars
from tests.support.launch_prompt import app_at, gpu_prompt, open_prompt, two_h200s
from tests.support.recorded import H200_HOST, RecordedHost, recorded_h200
from tests.support.waiting import settled, wait_for

SMALL = (80, 24)
HELPER_S = 60.0
"""The helper imports torch and builds the model on the meta device: seconds on a loaded 2-core machine."""


def plan_words(prompt: LaunchPrompt) -> str:
    bars = prompt.query_one(PlanBars)
    return str(bars.content) if bars.display else ""


async def planned(pilot: Any, prompt: LaunchPrompt) -> str:
    await wait_for(pilot, lambda: "Planning:" not in plan_words(prompt) and plan_words(prompt), HELPER_S,
                   "the model's description from the helper process")
    return plan_words(prompt)


async def test_each_gpu_gets_its_bar_as_the_overrides_are_typed(tmp_path: Path) -> None:
    """Story 2 under a 15 GiB cap: both GPUs run out at set-up, before anything is launched; a bigger cap
    replans at the next key, with no new helper; a smaller model waits for its own description."""
    app = app_at(tmp_path / "runs")
    async with app.run_test(size=SMALL) as pilot:
        prompt = await gpu_prompt(app, pilot, "zero3-linear")
        await pilot.press(*"gpu_mem_limit=15GiB")
        words = await planned(pilot, prompt)
        assert "Plan: ZeRO-3, fp32, model built whole first" in words
        assert "GPU 0-1" in words and "✗ does not fit" in words
        assert "Out of memory at set-up: the whole model as built" in words
        helpers = len(model_describer._answers)
        await pilot.press("backspace", "backspace", "backspace", "backspace", *"00GiB")  # 1500GiB
        await pilot.pause()
        assert "✓ fits" in plan_words(prompt) and "✗" not in plan_words(prompt)
        assert len(model_describer._answers) == helpers, "a cap alone must not describe the model again"
        await pilot.press(*" model.n_layers=16")
        assert "Planning:" in plan_words(prompt)
        words = await planned(pilot, prompt)
        assert "✓ fits" in words
        assert list_runs(tmp_path / "runs") == [], "the plan launched something"


async def test_without_gpus_it_plans_cpu_processes_against_the_limit(tmp_path: Path) -> None:
    """On a machine without GPUs the preset runs on CPU processes: one bar for the ranks, judged against
    ``gpu_mem_limit`` (which caps a CPU rank too), or not judged without one."""
    app = app_at(tmp_path / "runs")
    async with app.run_test(size=SMALL) as pilot:
        prompt = await open_prompt(app, pilot, "fsdp2-mlp")
        words = await planned(pilot, prompt)  # the preset as it is, planned as the prompt opens
        assert "rank 0-1 (CPU)" in words and "fits: not judged" in words
        await pilot.press(*"gpu_mem_limit=1MiB")
        await pilot.pause()
        assert "✗ does not fit" in plan_words(prompt)


async def test_a_model_that_cannot_be_built_says_why_in_one_line(tmp_path: Path) -> None:
    app = app_at(tmp_path / "runs")
    async with app.run_test(size=SMALL) as pilot:
        prompt = await gpu_prompt(app, pilot, "fsdp-auto-wrap")
        await pilot.press(*"model.heads=5")
        words = await planned(pilot, prompt)
        assert words.startswith("No plan: could not build the model on the meta device")
        assert "embed_dim must be divisible by num_heads" in words
        assert len(words.strip().splitlines()) == 1
        await pilot.press("enter")  # the plan failing does not stand in the way of a launch the config allows
        await wait_for(pilot, lambda: app.screen is not prompt, what="the launch")


def test_a_key_replans_from_the_description_in_hand(monkeypatch: pytest.MonkeyPatch) -> None:
    """What the prompt does on each key once the description is in hand: plan every strategy for every GPU,
    arithmetic alone, the model not built again (what a key costs: ``bench/bench_costs.py``)."""
    from shardtop.config import resolve
    from shardtop.launch import resolve_devices
    from shardtop.trace import meta
    from shardtop.trace.presets import describe_preset
    from shardtop.tui.widgets.plan_bars import plan_text, prompt_plan

    config = resolve_devices(resolve("zero3-linear", [("gpu_mem_limit", "15GiB")]), lambda: 2)
    desc = describe_preset(config)
    first = plan_text(prompt_plan(config, desc, two_h200s()))

    def built_again(*args: object, **kwargs: object) -> None:
        raise AssertionError("a key built the model again")

    monkeypatch.setattr(meta, "build_on_meta", built_again)
    again = [plan_text(prompt_plan(config, desc, two_h200s())).plain for _ in range(3)]
    assert "does not fit" in first.plain
    assert again == [first.plain] * 3


@pytest.fixture
def in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_the_plan_at_80x24(snap_compare: Any, in_tmp: Path) -> None:
    """Story 2 as asked, capped at 15 GiB, on two H200s: both bars past the limit, where it runs out, what fits."""
    app = ShardtopApp(
        in_tmp / "runs",
        refresh=3600.0,
        gpu_source=recorded_h200(),  # type: ignore[arg-type]
        host_probe=RecordedHost(H200_HOST),  # type: ignore[arg-type]
        clock=lambda: 1795966800.0,
    )

    async def run_before(pilot: Any) -> None:
        prompt = await gpu_prompt(pilot.app, pilot, "zero3-linear")
        prompt.query_one(Input).cursor_blink = False  # a blinking cursor would make the picture a coin toss
        await pilot.press(*"gpu_mem_limit=15GiB")
        await planned(pilot, prompt)
        await settled(pilot)

    assert snap_compare(app, terminal_size=SMALL, run_before=run_before)
