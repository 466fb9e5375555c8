"""The pure parts of the widgets: columns, cells, owners, launch checks, findings, memory rows."""

from __future__ import annotations

from pathlib import Path

import pytest
from rich.style import Style

from shardtop.config import ConfigError
from shardtop.diagnose import Finding
from shardtop.events import GpuMemory, Hello, Memory, Oom
from shardtop.gpus import GpuProcessInfo
from shardtop.run_state import fold
from shardtop.runs import RunDirectory
from shardtop.tui.screens.launch_prompt import check_launch
from shardtop.tui.tree_columns import fit, tree_columns
from shardtop.tui.watch.run_catalog import RankOwner
from shardtop.tui.watch.run_feed import RunFeed
from shardtop.tui.widgets.findings_list import concerning, findings_text
from shardtop.tui.widgets.gpu_panel import owners_text
from shardtop.tui.widgets.process_table import process_cells
from shardtop.tui.widgets.rank_memory import device_index, rank_rows
from shardtop.tui.widgets.run_header import header_info
from tests.tui.recorded import PIDS, zero3_oom_run


def test_columns_keep_names_readable_and_fold_many_ranks() -> None:
    wide = tree_columns(160, 2)
    assert wide.ranks_shown == 2 and wide.state and wide.name >= 24
    narrow = tree_columns(76, 2)
    assert narrow.ranks_shown == 2 and narrow.name >= 24
    six = tree_columns(76, 6)
    assert six.ranks_shown == 0 and six.range > 0, "six ranks at 80 columns: one min…max column"
    for cols, n in ((wide, 2), (narrow, 2)):
        used = cols.name + cols.type + 1 + cols.params + 1 + (cols.state + 1 if cols.state else 0) + n * (cols.rank + 1)
        assert used <= (160 if cols is wide else 76)


def test_fit_cuts_with_an_ellipsis_and_pads() -> None:
    plain = Style()
    assert "".join(s.text for s in fit([("abc", plain), ("defgh", plain)], 6, plain)) == "abcde…"
    assert "".join(s.text for s in fit([("ab", plain)], 4, plain)) == "ab  "


def test_owners_and_process_cells_say_what_is_hidden() -> None:
    owners = {PIDS[0]: RankOwner("20261129-122640-zero3-linear-0a0e", 0)}
    assert owners_text([PIDS[0], 99], owners) == f"zero3-linear-0a0e r0 pid {PIDS[0]}, pid 99"
    ghost = process_cells(GpuProcessInfo(7, (0, 1), None, "not-visible"), {})
    assert ghost[2] == "0,1" and "not visible" in ghost[-1] and ghost[3] == "-"
    other = process_cells(GpuProcessInfo(8, (0,), 2**30, "other-user", "alice"), {})
    assert other[1] == "alice (other user)" and other[-1] == "(hidden: other user)"
    mine = process_cells(GpuProcessInfo(PIDS[0], (0,), 2**30, "own", "me", "python train.py", 99.4, 2**31), owners)
    assert mine[4] == "99" and mine[6] == "zero3-linear-0a0e r0" and mine[-1] == "python train.py"


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
        severity="error",
        saving_bytes=2**30,
        modules=("net",),
    )
    whole_run = Finding("precision-mismatch", "fp16 vs 32", "", "", modules=())
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
    rows = rank_rows(state)
    assert [r.gpu.index if r.gpu else None for r in rows] == [1, 0], "rank 1's pid is on GPU 0 (CUDA_VISIBLE_DEVICES)"
    assert rows[0].limit == 8 and rows[1].oom and rows[1].limit == 8
    assert device_index("cuda:3") == 3 and device_index("cpu") is None


def test_header_words_for_story_2(tmp_path: Path) -> None:
    snap = RunFeed(RunDirectory(zero3_oom_run(tmp_path, n_layers=10, culprit=7))).poll()
    assert snap is not None
    info = header_info(snap)
    assert (info.preset, info.engine, info.strategy) == ("zero3-linear", "zero3", "deepspeed_stage_3")
    assert info.held == "held as plain at setup"
    assert info.ranks == "2 ranks on gpu-box" and info.phase == "setup" and info.status == "failed (exit 1)"
    assert info.ended is not None and info.started is not None and info.ended - info.started == 60
