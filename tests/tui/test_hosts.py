"""A run over several hosts in the TUI: grouped by host in the run view, listed by host at home.

The two-host run is a real recording (``tests/fixtures/runs/cpu-2hosts``: FSDP2 on
``node-a`` and ``node-b``, two CPU ranks each; c10d put ranks 0-1 on ``node-b``).
The login node watches a live copy of the real two-H200 recording, whose rank 0
sampled its host's GPUs; the larger run is the benchmark's (``bench/bench_scale.py``).
"""

from __future__ import annotations

import time
from pathlib import Path

from textual.widgets import Static

from shardtop.rundir.event_files import event_file
from shardtop.rundir.event_lines import encode
from shardtop.rundir.events import Oom
from shardtop.tui.app import ShardtopApp
from shardtop.tui.screens.home import HomeScreen
from shardtop.tui.widgets.gpu_panel import GpuPanel
from shardtop.tui.widgets.module_details import ModuleDetails
from shardtop.tui.widgets.rank_memory import RankMemory
from shardtop.tui.widgets.remote_gpus import RemoteGpus
from shardtop.tui.widgets.run_list import COLUMNS, RunList
from shardtop.tui.widgets.shard_tree import ShardTree
from tests.support.apps import text_of
from tests.support.recorded import H200_HOST, NoDriver, RecordedHost, copy_runs, live_copy, recorded_h200
from tests.support.recorded import LOGIN_NODE as LOGIN_HOST
from tests.support.waiting import settled, wait_for

TWO_HOSTS = "cpu-2hosts/fsdp2_train"
LOGIN_NODE = RecordedHost(LOGIN_HOST, name="login-1")


async def test_the_run_view_groups_a_two_host_run_by_host(tmp_path: Path) -> None:
    run = copy_runs(tmp_path, TWO_HOSTS)[TWO_HOSTS]
    app = ShardtopApp(tmp_path, run=str(run), gpu_source=recorded_h200(), host_probe=RecordedHost(H200_HOST))  # type: ignore[arg-type]
    async with app.run_test(size=(160, 48)) as pilot:
        tree = app.screen.query_one(ShardTree)
        await wait_for(pilot, lambda: tree.model is not None and tree.border_subtitle, what="the tree with its hosts")
        assert tree.border_subtitle == "2 hosts: node-a r2–3 · node-b r0–1"
        header = tree.render_line(0).text
        assert header.split()[-4:] == ["r2", "r3│", "r0", "r1"], f"host by host, a mark where node-b begins: {header!r}"
        model_row = tree.render_line(1).text
        assert model_row.rstrip().endswith("12.6K 12.6K│12.8K 12.6K"), model_row
        lines = app.screen.query_one(RankMemory).render().plain.splitlines()
        memory = [line for line in lines if not line.startswith(" ")]  # under each bar: its memory per step
        assert [line.split()[0] for line in memory] == ["node-a", "r2", "r3", "node-b", "r0", "r1"], lines
        assert memory[0].endswith("r2–3") and memory[3].endswith("r0–1")
        await pilot.press("slash", "f", "c")
        assert tree.border_subtitle == "3 matches", "blocks.0.fc, blocks.1.fc, blocks.2.fc: the subtitle counts them"
        await pilot.press("backspace", "backspace")
        assert tree.border_subtitle == "2 hosts: node-a r2–3 · node-b r0–1", "and says the hosts again after"


async def test_the_home_screen_lists_a_run_by_its_hosts(tmp_path: Path) -> None:
    copy_runs(tmp_path, TWO_HOSTS, "h200/zero3-linear")
    app = ShardtopApp(tmp_path, gpu_source=recorded_h200(), host_probe=RecordedHost(H200_HOST))  # type: ignore[arg-type]
    async with app.run_test(size=(160, 48)) as pilot:
        runs = app.screen.query_one(RunList)
        await wait_for(pilot, lambda: runs.row_count == 2, what="the run list")
        hosts = {runs.get_row_at(i)[0]: runs.get_row_at(i)[COLUMNS.index("HOSTS")] for i in range(2)}
        assert hosts == {"fsdp2_train-2h": "2", "zero3-linear-21d1": "vm"}, "two hosts counted; one host named"


async def test_a_login_node_without_gpus_shows_the_gpus_the_runs_report(tmp_path: Path) -> None:
    live_copy(tmp_path, "h200x2/zero3-linear-fixed")
    app = ShardtopApp(tmp_path, gpu_source=NoDriver(), host_probe=LOGIN_NODE)  # type: ignore[arg-type]
    async with app.run_test(size=(160, 48)) as pilot:
        screen = app.screen
        assert isinstance(screen, HomeScreen)
        panel = screen.query_one(GpuPanel)
        await wait_for(pilot, lambda: screen.runs is not None and screen.runs.host_gpus, what="the hosts' GPUs")
        await pilot.pause()
        assert panel.border_title == "GPUs (2 on 1 host)"
        lines = screen.query_one(RemoteGpus).render().plain.splitlines()
        assert [line.split()[:3] for line in lines] == [["vm", "0", "H200"], ["vm", "1", "H200"]], lines
        assert "zero3-linear-fixed-5e05 r0 pid 942" in lines[0] and "r1 pid 943" in lines[1], "which rank is on it"
        assert "No NVIDIA GPU here" in panel.query_one(".gpu-panel--notice").render().plain  # type: ignore[attr-defined]


async def test_the_machine_a_run_runs_on_shows_its_gpus_once(tmp_path: Path) -> None:
    """The recorded ranks ran on ``vm``: watched from ``vm`` itself, NVML shows those GPUs, the events do not again."""
    live_copy(tmp_path, "h200x2/zero3-linear-fixed")
    app = ShardtopApp(tmp_path, gpu_source=recorded_h200(), host_probe=RecordedHost(H200_HOST))  # type: ignore[arg-type]
    async with app.run_test(size=(160, 48)) as pilot:
        screen = app.screen
        assert isinstance(screen, HomeScreen)
        await wait_for(pilot, lambda: screen.runs is not None and screen.gpus is not None, what="the home screen")
        assert screen.runs is not None and screen.runs.host_gpus == ()
        assert not screen.query_one(RemoteGpus).display and screen.query_one(GpuPanel).border_title == "GPUs (1)"


async def test_many_ranks_take_a_line_per_host(tmp_path: Path) -> None:
    from bench.bench_scale import make_run

    run = make_run(tmp_path, hosts=3)
    oom = Oom(phase="forward", step=8, module="blocks.3.mlp.fc", rank=13, host="gpu-002", t=time.time())
    with open(event_file(run / "events", 13), "ab") as f:
        f.write(encode(oom))
    app = ShardtopApp(tmp_path, run=str(run), gpu_source=NoDriver(), host_probe=LOGIN_NODE)  # type: ignore[arg-type]
    async with app.run_test(size=(160, 48)) as pilot:
        ranks = app.screen.query_one(RankMemory)
        await wait_for(pilot, lambda: len(ranks.rows) == 24, what="24 ranks")
        await settled(pilot)  # laid out at its height: a picture before that folds the hosts into one line
        assert ranks.border_title == "Memory per host (24 ranks), of 140 GiB GPU", "every bar against its GPU"
        lines = ranks.render().plain.splitlines()
        assert [line.split()[:3] for line in lines] == [["gpu-001", "8", "ranks"], ["gpu-002", "8", "ranks"],
                                                        ["gpu-003", "8", "ranks"]], lines
        assert "✗ OOM" in lines[1] and "✗" not in lines[0] + lines[2], "the host where rank 13 ran out says so"
        assert "G…" in lines[0] and "/140G" in lines[0], "lowest…highest allocation of the host's ranks, of its GPUs"
        tree = app.screen.query_one(ShardTree)
        await wait_for(pilot, lambda: tree.model is not None, what="the tree")
        assert tree.render_line(0).text.rstrip().endswith("per rank"), "24 rank columns do not fit: one min…max"
        assert tree.border_subtitle == "3 hosts: gpu-001 r0–7 · gpu-002 r8–15 · gpu-003 r16–23"
        panel = app.screen.query_one(ModuleDetails).query_one("#details-text", Static)
        await wait_for(
            pilot, lambda: text_of(panel).split()[:2] == ["module", "blocks.3.mlp.fc"], what="the OOM's module"
        )
        details = text_of(panel)
        assert "blocks.3.mlp.fc" in details and "r0–23  5.33M  cuda    sharded" in details, "24 ranks alike: one row"
        await pilot.press("home")
        await wait_for(
            pilot, lambda: text_of(panel).split()[:4] == ["module", "(the", "whole", "model)"], what="the root"
        )
        details = text_of(panel)
        assert "405M on each of 24 ranks" in details, "the whole model's share (9.49 GiB / 24): one figure, not 24"


async def test_a_login_node_sums_up_64_hosts_gpus_in_a_third_of_the_screen(tmp_path: Path) -> None:
    from bench.bench_scale import make_run

    make_run(tmp_path, hosts=64)  # alive by its hosts' supervisor records, as seen from another machine
    app = ShardtopApp(tmp_path, gpu_source=NoDriver(), host_probe=LOGIN_NODE)  # type: ignore[arg-type]
    async with app.run_test(size=(160, 48)) as pilot:
        screen = app.screen
        assert isinstance(screen, HomeScreen)
        await wait_for(pilot, lambda: screen.runs is not None and screen.runs.host_gpus, timeout=30, what="64 hosts")
        await pilot.pause()
        assert screen.query_one(GpuPanel).border_title == "GPUs (512 on 64 hosts)"
        lines = screen.query_one(RemoteGpus).render().plain.splitlines()
        assert len(lines) == 16, "a third of 48 lines"
        assert lines[0].split()[:4] == ["gpu-001", "8", "×", "H200"] and "util 9" in lines[0], lines[0]
        assert lines[-1].split()[:4] == ["+49", "hosts", "392", "×"], "the rest summed up in one line"
        runs = screen.query_one(RunList)
        assert runs.get_row_at(0)[COLUMNS.index("HOSTS")] == "64"
