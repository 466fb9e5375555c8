"""The Findings tab says what the run did, in its precision, and prints no field it has nothing for."""

from __future__ import annotations

from pathlib import Path

import pytest
from textual.widgets import Static

from shardtop.tui.widgets.findings_list import FindingsList
from tests.support.apps import run_app, run_ready, text_of
from tests.support.recorded import copy_runs


async def findings_of(root: Path, run: Path) -> str:
    app = run_app(root, run)
    async with app.run_test(size=(160, 48)) as pilot:
        await run_ready("f")(pilot)
        return text_of(app.screen.query_one(FindingsList).query_one("#findings-text", Static))


@pytest.mark.parametrize(
    ("name", "engine_does"),
    [
        pytest.param(
            "cpu-6ranks/zero3-linear", "it stays whole until ZeRO-3 partitions it (in fp32 on CPU", id="cpu-fp32"
        ),
        pytest.param(
            "h200/zero3-linear", "_configure_distributed_model moves it to the GPU whole, on every rank", id="gpu-fp32"
        ),
    ],
)
async def test_story_2_in_fp32_is_not_said_to_be_cast_to_half_precision(
    in_tmp: Path, name: str, engine_does: str
) -> None:
    runs = copy_runs(in_tmp / "runs", name)
    words = " ".join((await findings_of(in_tmp / "runs", runs[name])).split())  # the panel's wrapping undone
    assert "[zero3-not-partitioned-at-init]" in words
    assert engine_does in words
    assert "fp16" not in words and "bf16" not in words and "casts it to" not in words, "an fp32 run casts nothing"


async def test_a_finding_about_the_whole_model_prints_no_empty_modules_line(in_tmp: Path) -> None:
    runs = copy_runs(in_tmp / "runs", "cpu-6ranks/zero3-linear")
    text = await findings_of(in_tmp / "runs", runs["cpu-6ranks/zero3-linear"])
    assert "[zero3-not-partitioned-at-init]" in text
    lines = [line.strip() for line in text.splitlines()]
    assert "modules:" not in lines, "no field without a value"
    assert not [line for line in lines if line.endswith(":") and line.split()[0] in ("modules:", "fix:")]
