"""The pure parts of the widgets: columns, cells, owners, launch checks, findings, memory rows."""

from __future__ import annotations

import io
from dataclasses import replace
from pathlib import Path

import msgspec
import pytest
from rich.console import Console
from rich.style import Style

from shardtop.config import ConfigError
from shardtop.diagnose import Evidence, Finding
from shardtop.gpus import GpuProcessInfo
from shardtop.read.oom_story import OomStory, under_zero_init
from shardtop.read.rank_facts import held
from shardtop.read.run_fold import fold
from shardtop.read.run_model import RunModel
from shardtop.rundir.events import Hello, Memory, Oom
from shardtop.rundir.memory_figures import GpuMemory
from shardtop.rundir.run_directory import RunDirectory
from shardtop.tui.rank_memory_rows import device_index, rank_rows
from shardtop.tui.screens.launch_prompt import check_launch
from shardtop.tui.shard_tree_rows import fit
from shardtop.tui.tree_columns import PARAMS, RANGE, RANK, cut, tree_columns
from shardtop.tui.watch.run_catalog import RankOwner
from shardtop.tui.watch.run_feed import RunFeed, RunSnapshot
from shardtop.tui.widgets.findings_list import concerning, findings_text
from shardtop.tui.widgets.gpu_bar import gpu_line_parts
from shardtop.tui.widgets.gpu_panel import owners_text
from shardtop.tui.widgets.oom_panel import culprit_words, no_module_words, oom_report
from shardtop.tui.widgets.process_table import process_cells
from shardtop.tui.widgets.rank_memory import memory_layout
from shardtop.tui.widgets.run_header import header_info
from tests.support.recorded import TRAINER_PIDS, copy_runs, eight_h200s

PIDS = TRAINER_PIDS[:2]


def used_cells(cols: object, ranks: int) -> int:
    c = cols
    return (
        c.name  # type: ignore[attr-defined]
        + c.type + 1  # type: ignore[attr-defined]
        + PARAMS + 1
        + (c.state + 1 if c.state else 0)  # type: ignore[attr-defined]
        + (c.device + 1 if c.device else 0)  # type: ignore[attr-defined]
        + c.ranks_shown * (RANK + 1)  # type: ignore[attr-defined]
        + (RANGE + 1 if c.range else 0)  # type: ignore[attr-defined]
    )


@pytest.mark.parametrize(
    ("width", "ranks", "state", "device", "shown"),
    [
        (94, 1, True, True, 1),  # 160 columns, the side panel beside the tree
        (78, 1, True, True, 1),  # 80 columns, one rank: state and device stay
        (78, 2, True, False, 2),  # two ranks: the device gives way first
        (92, 6, True, False, 6),  # 160 columns, six ranks: a column each
        (76, 6, True, False, 0),  # 80 columns with a scroll bar, six ranks: one min…max column
    ],
)
def test_columns_keep_names_readable_then_fold_the_ranks(
    width: int, ranks: int, state: bool, device: bool, shown: int
) -> None:
    cols = tree_columns(width, ranks)
    assert cols.name >= 24 and bool(cols.state) is state and bool(cols.device) is device
    assert cols.ranks_shown == shown and bool(cols.range) is (shown == 0)
    assert used_cells(cols, ranks) == width


def test_fit_and_cut_end_cut_text_with_an_ellipsis() -> None:
    plain = Style()
    assert "".join(s.text for s in fit([("abc", plain), ("defgh", plain)], 6, plain)) == "abcde…"
    assert "".join(s.text for s in fit([("ab", plain)], 4, plain)) == "ab  "
    assert cut("SegmentationHandWrapped", 10) == "Segmentat…" and cut("Linear", 10) == "Linear    "


def test_owners_and_process_cells_say_what_is_hidden() -> None:
    owners = {PIDS[0]: RankOwner("20261129-152050-zero3-linear-5c16", 0)}
    assert owners_text([PIDS[0], 99], owners) == f"zero3-linear-5c16 r0 pid {PIDS[0]}, pid 99"
    ghost = process_cells(GpuProcessInfo(7, (0, 1), None, "not-visible"), {})
    assert ghost[2] == "0,1" and "not visible" in ghost[-1] and ghost[3] == "-"
    other = process_cells(GpuProcessInfo(8, (0,), 2**30, "other-user", "alice"), {})
    assert other[1] == "alice (other user)" and other[-1] == "(hidden: other user)"
    mine = process_cells(GpuProcessInfo(PIDS[0], (0,), 2**30, "own", "me", "python train.py", 99.4, 2**31), owners)
    assert mine[4] == "99" and mine[6] == "zero3-linear-5c16 r0" and mine[-1] == "python train.py"


def test_launch_check_resolves_or_says_what_is_wrong() -> None:
    request = check_launch("fsdp2-mlp", "max_steps=3 model.n_layers=2", lambda: 0)
    assert request.config["max_steps"] == 3 and request.config["accelerator"] == "cpu"
    assert request.settings == ("preset=fsdp2-mlp", "max_steps=3", "model.n_layers=2")
    with pytest.raises(ConfigError, match="max_steps=many"):
        check_launch("fsdp2-mlp", "max_steps=many", lambda: 0)
    with pytest.raises(ConfigError, match="unknown key"):
        check_launch("fsdp2-mlp", "max_stpes=3", lambda: 0)
    with pytest.raises(ConfigError, match="key=value"):
        check_launch("fsdp2-mlp", "max_steps", lambda: 0)
    with pytest.raises(ConfigError, match="no NVIDIA GPU"):
        check_launch("fsdp2-mlp", "accelerator=cuda", lambda: 0)


def test_findings_concern_a_module_its_parents_and_children() -> None:
    about_net = Finding(
        "zero3-not-partitioned-at-init",
        "Built outside zero.Init",
        "moved whole",
        "configure_model()",
        Evidence(),
        severity="error",
        saving_bytes=2**30,
        modules=("net",),
    )
    whole_run = Finding("precision-mismatch", "fp16 vs 32", "", "", Evidence(), modules=())
    findings = [about_net, whole_run]
    assert concerning(findings, "net.12") == [about_net]
    assert concerning(findings, "net") == [about_net]
    assert concerning(findings, "") == [about_net]
    assert concerning(findings, "head") == []
    text = findings_text(findings).plain
    assert "✗ error" in text and "fix: configure_model()" in text and "saves ≈ 1 GiB per rank" in text


def test_rank_rows_match_nvml_by_pid_then_device() -> None:
    gpus = [GpuMemory(index=0, used=5, total=10, pids=[PIDS[1]]), GpuMemory(index=1, used=7, total=10)]
    state = fold(
        [
            Hello(pid=PIDS[0], world_size=2, device="cuda:1", rank=0, host="h"),
            Hello(pid=PIDS[1], world_size=2, device="cuda:1", rank=1, host="h"),
            Memory(device="cuda:1", allocated=3, reserved=4, peak=5, limit=8, gpus=gpus, rank=0, host="h"),
            Oom(phase="setup", rank=1, host="h", limit=8),
        ]
    )
    rows = rank_rows(RunModel.of(state))
    assert [r.gpu.index if r.gpu else None for r in rows] == [1, 0], "rank 1's pid is on GPU 0 (CUDA_VISIBLE_DEVICES)"
    assert rows[0].limit == 8 and rows[1].status.state == "out of memory" and rows[1].limit == 8
    assert device_index("cuda:3") == 3 and device_index("cpu") is None


def story2_snapshot(tmp_path: Path, name: str = "h200/zero3-linear") -> RunSnapshot:
    snap = RunFeed(RunDirectory(copy_runs(tmp_path, name)[name])).poll()
    assert snap is not None
    return snap


def test_header_words_for_story_2(tmp_path: Path) -> None:
    snap = story2_snapshot(tmp_path)
    info = header_info(snap)
    assert (info.preset, info.engine, info.strategy) == ("zero3-linear", "zero3", "deepspeed_stage_3")
    assert info.ranks == "1 rank on vm" and info.phase == "setup" and info.status == "failed (exit 1)"
    assert info.ended is not None and info.started is not None and round(info.ended - info.started) == 91


def test_the_memory_bar_ends_at_the_oom(tmp_path: Path) -> None:
    """Story 2 fixed on one H200: the last allocator sample, taken as the rank unwound after the OOM, said
    1 MiB; the OOM 15.0 GiB: the bar shows the OOM's."""
    snap = story2_snapshot(tmp_path, "h200/zero3-linear-fixed")
    state = snap.state
    (row,) = rank_rows(snap.model)
    oom = snap.model.ooms[0].oom
    assert state.ranks[0].memory is not None and state.ranks[0].memory.allocated < oom.allocated  # type: ignore[operator]
    assert (row.allocated, row.reserved, row.limit) == (oom.allocated, oom.reserved, oom.limit)
    assert row.peak == oom.allocated, "the bar's mark: allocated memory's peak, the OOM's"
    assert row.gpu is not None and row.gpu.used == oom.gpus[0].used, "NVML at the OOM"  # type: ignore[index]


def test_a_rank_that_went_on_after_its_oom_shows_its_latest_sample(tmp_path: Path) -> None:
    """The same rank, had it caught the OOM and gone on (no exit yet): the sample after the OOM is what it
    holds now."""
    snap = story2_snapshot(tmp_path, "h200/zero3-linear-fixed")
    rank = snap.state.ranks[0]
    assert rank.memory is not None and rank.oom is not None and rank.memory.t > rank.oom.t
    going_on = replace(rank, exit=None)
    assert held(going_on)[0] == rank.memory.allocated == 1_051_136
    assert held(rank)[0] == rank.oom.allocated


def test_the_bar_stacks_kinds_only_of_the_moment_it_shows(tmp_path: Path) -> None:
    """fsdp-not-sharding, finished: the latest split was taken as step 5's backward began (584 MB allocated),
    the latest sample at teardown (144 MB). Its kinds would stack to the backward's total: the bar is plain.
    At story 2's OOM the split and the figures are the OOM's: its kinds stack."""
    snap = story2_snapshot(tmp_path, "h200/fsdp-not-sharding")
    (row,) = rank_rows(snap.model)
    split = snap.model.ranks[0].memory_now
    assert split is not None and split.allocated is not None and row.allocated is not None
    assert split.allocated > 3 * row.allocated and row.parts == ()
    (oom_row,) = rank_rows(story2_snapshot(tmp_path / "oom").model)
    assert [p.name for p in oom_row.parts][:1] == ["params"]


def test_memory_layout_by_width_and_ranks() -> None:
    assert memory_layout(62, 6) == "wide"
    assert [memory_layout(28, n) for n in (1, 2, 3, 4, 6)] == ["tall", "tall", "two-line", "two-line", "one-line"]


def test_oom_words_without_a_module(tmp_path: Path) -> None:
    """zero3-linear-fixed on the H200 ran out under zero.Init; the probe may name the type being built."""
    typed = story2_snapshot(tmp_path, "h200/zero3-linear-fixed").model.ooms[0]
    assert typed.module is None and under_zero_init(typed.oom)
    assert (typed.module_type, typed.oom.attributed_by) == ("Linear", "init-frame")
    assert culprit_words(typed).plain == "not known: a Linear being built under deepspeed.zero.Init"
    untyped = OomStory(msgspec.structs.replace(typed.oom, module_type=None, attributed_by="engine-step"), None)
    assert culprit_words(untyped).plain == "not known: a module being built under deepspeed.zero.Init"
    assert no_module_words(typed) == (
        "The OOM names no module path: rank 0 ran out of memory in Init._partition_param, "
        "with a Linear being built under deepspeed.zero.Init."
    )
    console = Console(width=100, record=True, file=io.StringIO(), color_system=None)
    console.print(oom_report(typed, (), ()))
    words = " ".join(console.export_text().split())
    assert "found by the type of the module being built under deepspeed.zero.Init" in words
    phase_only = OomStory(
        msgspec.structs.replace(typed.oom, engine_step=None, module_type=None, attributed_by="phase"), None
    )
    assert culprit_words(phase_only).plain == "not known"
    assert no_module_words(phase_only).endswith("ran out of memory during setup.")


def test_story1_tree_says_units_offloaded_on_cpu_and_stray_layers_whole_on_cuda(tmp_path: Path) -> None:
    model = story2_snapshot(tmp_path, "h200/fsdp-not-sharding").tree
    assert model is not None
    units = {model.paths[m] for m in model.unit_roots}
    assert units == {"transformers1", "transformer_0", "transformer_1", "transformers_out"}
    for path in units:
        placed = model.placement(model.row_of(path))  # type: ignore[arg-type]
        assert (placed.state, placed.device) == ("offloaded", "cpu"), path
    for path in ("conv1", "bn1", "conv2", "bn2", "conv_out", "out_layer"):
        placed = model.placement(model.row_of(path))  # type: ignore[arg-type]
        assert (placed.state, placed.device) == ("unsharded", "cuda:0"), path
    root = model.placement(0)
    assert (root.state, root.device) == ("offloaded+unsharded", "cpu+cuda:0")
    assert model.placement(model.row_of("relu")).state == "", "no parameters: nothing to say"  # type: ignore[arg-type]


def test_gpu_lines_stay_one_line_with_long_names() -> None:
    """At 80 columns a GPU's name is cut to 8 cells, so eight GPUs are eight lines."""
    long = msgspec.structs.replace(eight_h200s().samples[-1][0], name="NVIDIA H200 NVL 141GB HBM3e")
    narrow, wide = gpu_line_parts(long, 76), gpu_line_parts(long, 156)
    assert narrow["name"] == "H200 NV…" and len(wide["name"]) == 14 and wide["name"].endswith("…")
    assert narrow["memory"] == " 14.2/140G" and narrow["util"] == " 97%"


def test_code_spans_lose_their_backticks_and_stand_out() -> None:
    from shardtop.tui.widgets.findings_list import with_code_spans

    text = with_code_spans("converting `model.net.15330` (Linear) under `zero.Init`")
    assert text.plain == "converting model.net.15330 (Linear) under zero.Init"
    bold = [text.plain[s.start:s.end] for s in text.spans if s.style == "bold"]
    assert bold == ["model.net.15330", "zero.Init"]
