"""What the user sees, at 80×24 (SSH) and 160×48, replaying real recorded runs.

The runs are the H200 and CPU recordings (``tests/fixtures/runs/``, and the first
launches on CPU in ``tests/tui/fixtures/cpu-first-minutes/``), read and diagnosed
live, as a user would see them.  Deterministic: the recordings are
fixed data; NVML's and psutil's answers are recorded; the runs are finished (their
elapsed time ends with them); one GPU sample (a refresh longer than the test);
the clock, the time zone (UTC) and the working directory (paths are shown
relative to it) are frozen.  Update after a deliberate change with
``pytest tests/tui/test_snapshots.py --snapshot-update`` and look at the report
before committing.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from shardtop.gpus import HostSample
from shardtop.tui.app import ShardtopApp
from tests.support.apps import HOUR, frozen_clock, home_ready, run_app, run_ready
from tests.support.first_minutes import CPU_OOM, FIRST_LAUNCH, copy_first_minutes
from tests.support.recorded import (
    ALL_RUNS,
    EIGHT_GPU_HOST,
    LOGIN_NODE,
    NoDriver,
    RecordedHost,
    copy_runs,
    eight_h200_processes,
    eight_h200s,
    live_copy,
)
from tests.support.waiting import settled

SIZES = [pytest.param((80, 24), id="80x24"), pytest.param((160, 48), id="160x48")]


@pytest.fixture
def every_run(in_tmp: Path) -> Path:
    """A runs root with every recording: the run list of the home view."""
    root = in_tmp / "runs"
    copy_runs(root, *ALL_RUNS)
    return root


@pytest.mark.parametrize("size", SIZES)
def test_home_with_eight_gpus(snap_compare: Any, every_run: Path, size: tuple[int, int]) -> None:
    """Six H200s busy with one rank each, one idle, one another user's: one line each, also at 80×24."""
    app = ShardtopApp(
        every_run,
        refresh=HOUR,
        gpu_source=eight_h200s(),  # type: ignore[arg-type]
        host_probe=RecordedHost(EIGHT_GPU_HOST, eight_h200_processes()),  # type: ignore[arg-type]
        clock=frozen_clock,
    )
    assert snap_compare(app, terminal_size=size, run_before=home_ready())


@pytest.mark.parametrize("size", SIZES)
def test_home_without_a_driver(snap_compare: Any, every_run: Path, size: tuple[int, int]) -> None:
    host = RecordedHost(HostSample(cpu_percent=3.0, cores=8, memory_used=6 * 2**30, memory_total=31 * 2**30))
    laptop = ShardtopApp(
        every_run,
        refresh=HOUR,
        gpu_source=NoDriver(),
        host_probe=host,  # type: ignore[arg-type]
        clock=frozen_clock,
    )
    assert snap_compare(laptop, terminal_size=size, run_before=home_ready())


@pytest.mark.parametrize("size", SIZES)
def test_home_on_a_login_node(snap_compare: Any, in_tmp: Path, size: tuple[int, int]) -> None:
    """No GPU here: a live run's ranks report their host's two H200s, each labelled with that host (``vm``);
    the recorded two-host job lists its 2 hosts."""
    root = in_tmp / "runs"
    copy_runs(root, "cpu-2hosts/fsdp2_train")
    live_copy(root, "h200x2/zero3-linear-fixed")
    login = ShardtopApp(
        root,
        refresh=HOUR,
        gpu_source=NoDriver(),
        host_probe=RecordedHost(LOGIN_NODE, name="login-1"),  # type: ignore[arg-type]
        clock=frozen_clock,
    )
    assert snap_compare(login, terminal_size=size, run_before=home_ready())


@pytest.mark.parametrize("size", SIZES)
def test_run_view_of_two_hosts(snap_compare: Any, in_tmp: Path, size: tuple[int, int]) -> None:
    """A real job on two hosts (two CPU ranks each): rank columns and memory bars host by host, hosts named."""
    runs = copy_runs(in_tmp / "runs", "cpu-2hosts/fsdp2_train")
    app = run_app(in_tmp / "runs", runs["cpu-2hosts/fsdp2_train"])
    assert snap_compare(app, terminal_size=size, run_before=run_ready())


@pytest.mark.parametrize("size", SIZES)
def test_run_view_at_the_oom(snap_compare: Any, in_tmp: Path, size: tuple[int, int]) -> None:
    """Story 2 on the H200: the tree opened at model.net.15330, the OOM tab with the live diagnosis."""
    runs = copy_runs(in_tmp / "runs", "h200/zero3-linear")
    app = run_app(in_tmp / "runs", runs["h200/zero3-linear"])
    assert snap_compare(app, terminal_size=size, run_before=run_ready())


@pytest.mark.parametrize("size", SIZES)
def test_run_view_of_story_2_on_two_h200s(snap_compare: Any, in_tmp: Path, size: tuple[int, int]) -> None:
    """Two real ranks, both OOM moving the whole model; both memory bars at the 15 GiB cap."""
    runs = copy_runs(in_tmp / "runs", "h200x2/zero3-linear")
    app = run_app(in_tmp / "runs", runs["h200x2/zero3-linear"])
    assert snap_compare(app, terminal_size=size, run_before=run_ready())


def test_run_view_at_the_oom_without_colour(snap_compare: Any, in_tmp: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """NO_COLOR: the OOM still reads as ✗ OOM, the bars as █ ▒ ░, the statuses as words."""
    monkeypatch.setenv("NO_COLOR", "1")
    runs = copy_runs(in_tmp / "runs", "h200/zero3-linear")
    app = run_app(in_tmp / "runs", runs["h200/zero3-linear"])
    assert snap_compare(app, terminal_size=(80, 24), run_before=run_ready())


def test_run_view_search_and_log(snap_compare: Any, in_tmp: Path) -> None:
    runs = copy_runs(in_tmp / "runs", "h200/zero3-linear")
    app = run_app(in_tmp / "runs", runs["h200/zero3-linear"])
    keys = ("slash", *"net.12", "enter", "n", "l")
    assert snap_compare(app, terminal_size=(80, 24), run_before=run_ready(*keys))


@pytest.mark.parametrize("size", SIZES)
def test_run_view_of_an_oom_under_zero_init(snap_compare: Any, in_tmp: Path, size: tuple[int, int]) -> None:
    """Story 2 fixed, on one H200: no module tree ever came, the OOM names no module, the findings say why."""
    runs = copy_runs(in_tmp / "runs", "h200/zero3-linear-fixed")
    app = run_app(in_tmp / "runs", runs["h200/zero3-linear-fixed"])
    assert snap_compare(app, terminal_size=size, run_before=run_ready())


@pytest.mark.parametrize("size", SIZES)
def test_run_view_of_six_ranks(snap_compare: Any, in_tmp: Path, size: tuple[int, int]) -> None:
    """Story 2 on 6 CPU ranks: a column and a memory bar per rank, or the columns folded at 80×24."""
    runs = copy_runs(in_tmp / "runs", "cpu-6ranks/zero3-linear")
    app = run_app(in_tmp / "runs", runs["cpu-6ranks/zero3-linear"])
    assert snap_compare(app, terminal_size=size, run_before=run_ready("down", "down", "enter", "down"))


def test_run_view_of_fsdp_not_sharding(snap_compare: Any, in_tmp: Path) -> None:
    """Story 1 on the H200: the four hand-wrapped units offloaded on cpu, the stray layers whole on cuda:0."""
    runs = copy_runs(in_tmp / "runs", "h200/fsdp-not-sharding")
    app = run_app(in_tmp / "runs", runs["h200/fsdp-not-sharding"])
    assert snap_compare(app, terminal_size=(160, 48), run_before=run_ready("down", "m"))


def test_run_view_of_a_real_fsdp2_run(snap_compare: Any, in_tmp: Path) -> None:
    runs = copy_runs(in_tmp / "runs", "cpu/fsdp2-mlp")
    app = run_app(in_tmp / "runs", runs["cpu/fsdp2-mlp"])
    assert snap_compare(app, terminal_size=(80, 24), run_before=run_ready("down", "down", "down", "enter", "m"))


@pytest.mark.parametrize("size", SIZES)
def test_run_view_of_memory_by_kind_at_a_setup_oom(snap_compare: Any, in_tmp: Path, size: tuple[int, int]) -> None:
    """zero3-linear-fixed on an H200 with a 15 GiB cap: the bar stacks parameters, 1 KiB of gradients (▪),
    optimizer state, comm buffers and the cache, the peak at 11.7 GiB; the OOM tab says what filled it."""
    runs = copy_runs(in_tmp / "runs", "h200-split/zero3-linear-fixed")
    app = run_app(in_tmp / "runs", runs["h200-split/zero3-linear-fixed"])
    assert snap_compare(app, terminal_size=size, run_before=run_ready())


@pytest.mark.parametrize("size", SIZES)
def test_run_view_of_memory_by_kind_of_a_finished_run(snap_compare: Any, in_tmp: Path, size: tuple[int, int]) -> None:
    """fsdp-auto-wrap on an H200: 2.96 GiB of 140 at its peak, the bar magnified ×47; c: gradient bytes per module."""
    runs = copy_runs(in_tmp / "runs", "h200-split/fsdp-auto-wrap")
    app = run_app(in_tmp / "runs", runs["h200-split/fsdp-auto-wrap"])
    assert snap_compare(app, terminal_size=size, run_before=run_ready("c"))


def test_memory_by_kind_without_colour(snap_compare: Any, in_tmp: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """NO_COLOR: the kinds measured █, the cache ▒, the small kinds ▪ and the peak │ still read, the legend in words."""
    monkeypatch.setenv("NO_COLOR", "1")
    runs = copy_runs(in_tmp / "runs", "h200-split/zero3-linear-fixed")
    app = run_app(in_tmp / "runs", runs["h200-split/zero3-linear-fixed"])
    assert snap_compare(app, terminal_size=(80, 24), run_before=run_ready())


@pytest.mark.parametrize("size", SIZES)
def test_run_view_of_a_rehearsal(snap_compare: Any, in_tmp: Path, size: tuple[int, int]) -> None:
    """Story 2 rehearsed as ranks 0 and 3 of 4 on CPU: the header says which ranks of how many, in words;
    the Findings tab says once what a rehearsal cannot show, then what the rehearsed ranks held."""
    runs = copy_runs(in_tmp / "runs", "cpu-rehearsal/zero3-linear")
    app = run_app(in_tmp / "runs", runs["cpu-rehearsal/zero3-linear"])
    assert snap_compare(app, terminal_size=size, run_before=run_ready("f"))


def test_home_with_a_rehearsal(snap_compare: Any, in_tmp: Path) -> None:
    """The run list at 80×24: the rehearsals read "rehearsal finished", their ranks as rehearsed of the job's."""
    root = in_tmp / "runs"
    copy_runs(root, "cpu-rehearsal/zero3-linear", "cpu-rehearsal/fsdp2-mlp", "cpu-6ranks/zero3-linear",
              "cpu/fsdp2-mlp")
    laptop = ShardtopApp(
        root,
        refresh=HOUR,
        gpu_source=NoDriver(),
        host_probe=RecordedHost(LOGIN_NODE, name="laptop"),  # type: ignore[arg-type]
        clock=frozen_clock,
    )
    assert snap_compare(laptop, terminal_size=(80, 24), run_before=home_ready())


@pytest.mark.parametrize("size", SIZES)
def test_run_view_of_story_2_out_of_memory_on_cpu(snap_compare: Any, in_tmp: Path, size: tuple[int, int]) -> None:
    """Story 2 as the main job runs it on two CPU ranks (80 MiB each): both out of memory building the model; the
    tree at `net.73`, marked OOM, the layers before it held on cpu, those after not allocated yet (meta); each
    bar is what the rank's allocator handed out against its cap; the OOM tab says why."""
    run = copy_first_minutes(in_tmp / "runs", CPU_OOM)
    app = run_app(in_tmp / "runs", run)
    assert snap_compare(app, terminal_size=size, run_before=run_ready())


@pytest.mark.parametrize("size", SIZES)
def test_the_log_of_a_first_launch_on_cpu(snap_compare: Any, in_tmp: Path, size: tuple[int, int]) -> None:
    """The first launch on CPU, Log tab: torch's two FutureWarnings, printed five times by each rank, are two
    lines with their counts and ranks, their messages wrapped, not cut."""
    run = copy_first_minutes(in_tmp / "runs", FIRST_LAUNCH)
    app = run_app(in_tmp / "runs", run)
    assert snap_compare(app, terminal_size=size, run_before=run_ready("l"))


@pytest.mark.parametrize("size", SIZES)
def test_home_on_a_laptop_after_the_first_launches(snap_compare: Any, in_tmp: Path, size: tuple[int, int]) -> None:
    """No GPU; the two first launches of story 2 on CPU and the recorded CPU runs: at 80×24 the run list keeps
    each run's status, step and the note that says OOM; p highlights the first preset."""
    root = in_tmp / "runs"
    copy_runs(root, "cpu-6ranks/zero3-linear", "cpu-6ranks/zero3-linear-fixed", "cpu/fsdp2-mlp")
    copy_first_minutes(root, FIRST_LAUNCH)
    copy_first_minutes(root, CPU_OOM)
    laptop = ShardtopApp(
        root,
        refresh=HOUR,
        gpu_source=NoDriver(),
        host_probe=RecordedHost(LOGIN_NODE, name="laptop"),  # type: ignore[arg-type]
        clock=frozen_clock,
    )

    async def run_before(pilot: Any) -> None:
        await home_ready()(pilot)
        await pilot.press("p")
        await settled(pilot)

    assert snap_compare(laptop, terminal_size=size, run_before=run_before)
