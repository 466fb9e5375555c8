"""The run view of a run whose engine offloads: the tree's rank columns say what each rank holds on its device
and, as a figure of their own, what the engine holds in host memory; the details name it.

On a real recording (``tests/fixtures/runs/cpu-offload``): story 2 fixed on 2 gloo CPU processes with
DeepSpeed's ``offload_optimizer``, which keeps each rank's 24 MiB of fp32 master partition and Adam moments
and its 16 MiB of gradients in host memory; the 8.05 MiB parameter partitions are not offloaded.
"""

from __future__ import annotations

from pathlib import Path

from textual.widgets import Static

from shardtop.tui.app import ShardtopApp
from shardtop.tui.screens.run_view import RunScreen
from shardtop.tui.widgets.module_details import ModuleDetails
from shardtop.tui.widgets.shard_tree import ShardTree
from tests.support.apps import app_for, text_of
from tests.support.recorded import copy_runs
from tests.support.waiting import settled, wait_for

OFFLOADED = "cpu-offload/zero3-linear-fixed"


async def opened(pilot: object, app: ShardtopApp) -> RunScreen:
    await wait_for(
        pilot,
        lambda: isinstance(app.screen, RunScreen) and app.screen.query_one(ShardTree).model is not None,
        what="the run view with its tree",
    )
    await settled(pilot)
    assert isinstance(app.screen, RunScreen)
    return app.screen


async def test_the_rank_columns_offer_what_is_offloaded_and_count_the_device_apart(tmp_path: Path) -> None:
    runs = copy_runs(tmp_path / "runs", OFFLOADED)
    app = app_for(tmp_path / "runs", str(runs[OFFLOADED]))
    async with app.run_test(size=(160, 48)) as pilot:
        screen = await opened(pilot, app)
        tree = screen.query_one(ShardTree)
        seen = []
        for _ in range(7):
            words = tree.render_line(0).text.split("→")[0].split(maxsplit=1)[1].strip()
            seen.append((words, tree.render_line(1).text.split()[-1]))  # the root's r1 cell
            await pilot.press("c")
        assert seen == [
            ("parameter bytes per rank", "8.05M"),
            ("gradient bytes per rank", "0"),
            ("optimizer bytes per rank", "0"),
            ("activation bytes", "256K"),
            ("host-offloaded bytes", "40.1M"),
            ("on-device total bytes", "8.30M"),
            ("parameter bytes per rank", "8.05M"),
        ], "the header is cut to fit beside the columns; the total is the parameters and activations"
        await pilot.press("home", "m")
        details = " ".join(text_of(screen.query_one(ModuleDetails).query_one("#details-text", Static)).split())
        assert "offloaded r0 40.1M · r1 40.1M in host memory, by the engine's offload" in details, details
