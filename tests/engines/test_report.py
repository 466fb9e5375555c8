"""``shardtop report``: text, Markdown and JSON of real runs through the CLI; damaged and
empty runs; a 100 000-module tree; and the layout pieces on their own.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Any

import pytest

from shardtop.read.shard_model import ShardModel
from shardtop.report import render_report
from shardtop.report.document import Details, Facts, Heading, Para, Table, to_markdown, to_text
from shardtop.report.json_report import REPORT_SCHEMA_VERSION
from shardtop.report.tree_summary import TREE_MAX_ROWS, summarize_tree
from shardtop.rundir.event_files import EventWriter, event_file
from shardtop.rundir.events import Exit, Hello, Tree, tree_paths
from shardtop.rundir.run_config import RunConfig
from shardtop.rundir.run_directory import RunDirectory
from shardtop.rundir.run_meta import RunMeta
from shardtop.units import count_words as count
from tests.diagnose_scripts.real_runs import RealRun, runs_base, story
from tests.support.cli import report as report_of
from tests.support.recorded import big_tree_run, recorded_run


@pytest.fixture(scope="module")
def real(tmp_path_factory: pytest.TempPathFactory) -> Any:
    base = runs_base(tmp_path_factory)
    return lambda name: story(base, name)


def report(run: RealRun | Path, fmt: str = "text") -> str:
    return report_of(run.path if isinstance(run, RealRun) else run, fmt)


def table_rows_are_whole(markdown: str) -> None:
    """Every pipe table row has as many cells as its header (escaped pipes aside)."""
    width = None
    for line in markdown.splitlines():
        if not line.startswith("|"):
            width = None
            continue
        cells = len(re.split(r"(?<!\\)\|", line)) - 2
        if width is None:
            width = cells
        assert cells == width, line


# -- real runs, through the CLI -------------------------------------------------------------------


def test_text_report_of_story_1(real: Any) -> None:
    out = report(real("fsdp-not-sharding"))
    for expected in (
        "preset:     fsdp-not-sharding",
        "command:    shardtop launch preset=fsdp-not-sharding accelerator=cpu max_steps=2",
        "engine:     fsdp1 (FSDPStrategy, raw FSDP1 wrap() as in configure_sharded_model",
        "world size: 2 rank(s)",
        "status:     finished",
        "! warning: 258 KiB of parameters are outside every FSDP unit",
        "Fix: Delete configure_sharded_model",
        "Code: fsdp-manual-wrap-ignored",
        "Per rank",
        "Shard tree",
    ):
        assert expected in out, expected
    assert "`" not in out and "**" not in out  # no Markdown marks on a terminal
    tree = out[out.index("Shard tree") :]
    assert re.search(r"\(root\)\s+PatchSegmenter .* sharded\+unsharded\s+cpu", tree)
    assert re.search(r"├─conv1\s+Conv2d .* unsharded\s+cpu", tree)
    assert re.search(r"├─transformer_1\s+Sequential .* sharded\s+cpu\s+fsdp1 unit", tree)
    ranks = out[out.index("Per rank") : out.index("Shard tree")]
    assert re.search(r"^0\s+\S+\s+cpu\s+step\s+844 KiB", ranks, re.M)


def test_markdown_report_of_story_2_oom_pastes_into_an_issue(real: Any) -> None:
    out = report(real("zero3-built-whole"), "markdown")
    assert out.startswith("# shardtop report: ")
    ooms = json.loads(report(real("zero3-built-whole"), "json"))["ooms"]
    assert [o["rank"] for o in ooms] in ([0, 1], [1, 0]) and ooms[0]["t"] <= ooms[1]["t"], "the earliest first"
    first, other = ooms[0]["rank"], ooms[1]["rank"]
    oom = out[out.index("## Out of memory") : out.index("## Findings")]
    assert f"- **rank:** {first}" in oom and "- **phase:** setup" in oom
    assert "- **engine step:** `DeepSpeedEngine._configure_distributed_model`" in oom
    assert "- **module:** `net.0` (Linear)" in oom and "- **requested:** 18 MiB" in oom
    assert "### 1. ✗ error: Every rank held the whole model before ZeRO-3 partitioned it" in out
    assert "`zero3-not-partitioned-at-init`" in out
    details = out[out.index("<details>") :]
    assert f"<summary>Traceback of the OOM on rank {first} (innermost last)</summary>" in details
    assert "```text\n" in details and "_configure_distributed_model" in details and "</details>" in details
    assert f"The same frames on rank(s) {other}." in out
    assert "| module | type | params | full size | rank 0 | rank 1 | state | device | note |" in out
    # net.0 as a row of its own, or inside a fold of the four layers (as shard_model folds them)
    row = r"\| `  [├└]─(0|net\.0 … net\.3)` \| (Linear|4 × Linear) \|.*\| unsharded \| cpu \| ✗ OOM( in net\.0)? \|"
    assert re.search(row, out)
    table_rows_are_whole(out)


def test_markdown_tree_folds_repeated_siblings(real: Any) -> None:
    out = report(real("zero3-linear"), "markdown")
    row = next(line for line in out.splitlines() if "net.0 … net.15" in line)
    assert "| 16 × Linear |" in row and "| sharded | cpu |" in row
    table_rows_are_whole(out)


def test_markdown_report_of_a_recorded_h200_oom() -> None:
    out = report(recorded_run("h200/zero3-linear"), "markdown")
    assert "- **module stack:** `(root)` → `model` → `model.net` → `model.net.15330`" in out
    assert "| GPU 0 | NVIDIA H200 | 16.7 GiB | 140 GiB | rank 0 |" in out  # NVML at the OOM
    assert re.search(r"\| 0 \| \S+ \| cuda:0 \| setup \| 17.6 GiB \| - \| - \| 15 GiB \| 16.7 GiB / 140 GiB \|", out)
    assert "`    └─model.net.0 … model.net.17999` | 18000 × Linear |" in out and "✗ OOM in model.net.15330" in out
    assert "### 1. ✗ error: DeepSpeed moved the whole model to every GPU before ZeRO-3 partitioned it" in out
    assert "### 2. ✗ error: DeepSpeed ZeRO-3 on one rank shards nothing" in out
    table_rows_are_whole(out)


def test_json_report_schema_on_real_runs(real: Any) -> None:
    for name in ("zero3-built-whole", "fsdp-not-sharding", "zero3-linear"):
        data = json.loads(report(real(name), "json"))
        assert data["schema"] == "shardtop.report" and data["schema_version"] == REPORT_SCHEMA_VERSION
        assert data["world_size"] == 2 and data["engine"] in ("zero3", "fsdp1")
        assert data["events"]["skipped_total"] == 0
        assert [r["rank"] for r in data["ranks"]] == [0, 1]
        for f in data["findings"]:
            assert {"code", "severity", "title", "detail", "fix", "saving_bytes", "modules", "evidence"} <= set(f)
        modules = data["modules"]
        assert len(modules) == data["model"]["modules"] and modules[0]["path"] == ""
        assert sum(m["bytes"] for m in modules) == data["model"]["bytes"]
        for m in modules:
            assert set(m) >= {"path", "type", "params", "bytes", "ranks"}
            # a module with parameters of its own, or whose forward saved tensors, has a row per rank
            assert len(m["ranks"]) in (0, 2) and (m["params"] == 0 or len(m["ranks"]) == 2), m
            assert m["params"] > 0 or all(r.get("act_bytes") for r in m["ranks"]), m
            for r in m["ranks"]:
                assert {"rank", "bytes", "device", "state"} <= set(r)
                assert set(r) <= {"rank", "bytes", "device", "state", "grad_bytes", "optim_bytes", "act_bytes"}
        if name == "zero3-built-whole":
            oom = data["oom"]  # the earliest, whichever rank it was (both run out at the same step)
            assert (oom["phase"], oom["module"], oom["requested_bytes"]) == ("setup", "net.0", 18 << 20)
            assert oom == data["ooms"][0] and oom["t"] <= data["ooms"][1]["t"]
            assert len(data["ooms"]) == 2 and data["run"]["status"] != "finished"
        else:
            assert data["oom"] is None and data["ooms"] == []
        if name == "zero3-linear":
            # ZeRO-3 splits the weight and the bias, whose shares add up to them; the bias (512 values, under
            # the 1e5-element persistence threshold) is also held whole by both ranks, beside its shares.
            layer = next(m for m in modules if m["path"] == "net.3")
            bias = 512 * 4
            assert sum(r["bytes"] for r in layer["ranks"]) == layer["bytes"] + 2 * bias
            assert {r["state"] for r in layer["ranks"]} == {"sharded"}  # a row reads as its largest parameter
            assert modules[0]["unit"] == "zero3"


def test_json_modules_are_one_per_line(real: Any) -> None:
    out = report(real("fsdp-not-sharding"), "json")
    lines = out.splitlines()
    start = lines.index('  "modules": [')
    rows = lines[start + 1 : lines.index("  ]", start)]
    assert len(rows) == json.loads(out)["model"]["modules"]
    assert all(json.loads(line.rstrip(","))["path"] is not None for line in rows)


# -- damaged and empty runs -------------------------------------------------------------------------


def test_report_counts_and_mentions_unreadable_lines(real: Any, tmp_path: Path) -> None:
    copy = tmp_path / "runs" / real("fsdp-not-sharding").path.name
    shutil.copytree(real("fsdp-not-sharding").path, copy)
    rank1 = copy / "events" / "rank-1.jsonl"
    with open(rank1, "ab") as f:
        f.write(b'{"kind": "memory", "v": 1, "rank": 1, "host"\n')  # cut mid-object
        f.write(b'{"kind": "gpu-fan", "v": 1, "rank": 1}\n')  # a kind from a newer writer
        f.write(b'{"kind": "step", "v": 1, "rank": 1, "step": 3')  # torn last line, no newline
    text = report(copy)
    assert "⚠ 3 event line(s) could not be used (1 unreadable, 1 of unknown kinds, 1 cut off)" in text
    data = json.loads(report(copy, "json"))
    assert data["events"]["skipped"] == {"bad": 1, "unknown": 1, "newer": 0, "torn": 1}
    assert data["events"]["skipped_total"] == 3
    assert [f["code"] for f in data["findings"]][:1] == ["fsdp-manual-wrap-ignored"]


def test_report_of_a_truncated_event_file(real: Any, tmp_path: Path) -> None:
    copy = tmp_path / "runs" / real("zero3-built-whole").path.name
    shutil.copytree(real("zero3-built-whole").path, copy)
    for path in (copy / "events").glob("rank-*.jsonl"):
        raw = path.read_bytes()
        path.write_bytes(raw[: len(raw) // 3])  # the writer died early, mid-line
    for fmt in ("text", "markdown", "json"):
        out = report(copy, fmt)
        assert out.strip()
    data = json.loads(report(copy, "json"))
    assert data["events"]["skipped"]["torn"] >= 1


def test_report_of_a_run_with_no_events_yet(tmp_path: Path) -> None:
    root = tmp_path / "runs"
    run = RunDirectory.create(root, "fsdp2-mlp", RunMeta(
        preset="fsdp2-mlp", config=RunConfig(world_size=2), command=("shardtop", "launch", "fsdp2-mlp")
    ))
    (run.logs_dir / "rank-0.log").write_text(
        "Traceback (most recent call last):\n  ...\nModuleNotFoundError: No module named 'deepspeed'\n"
    )
    text = report(run.path)
    assert "No events yet" in text and "No module tree reported yet." in text
    assert "No findings" not in text, "a run that ended having recorded nothing is not a run where nothing looks wrong"
    assert "Nothing was recorded" in text and "ModuleNotFoundError: No module named 'deepspeed'" in text
    md = report(run.path, "markdown")
    assert "No events yet" in md
    data = json.loads(report(run.path, "json"))
    assert (data["engine"], data["oom"], data["modules"]) == (None, None, [])
    (nothing,) = data["findings"]
    assert nothing["code"] == "nothing-recorded" and nothing["severity"] == "error"
    assert nothing["evidence"]["log"] == "logs/rank-0.log" and nothing["evidence"]["status"] == "lost"
    assert data["events"]["read"] == 0 and data["run"]["preset"] == "fsdp2-mlp"


def test_a_script_run_without_a_launcher_is_told_by_its_ranks_exits(real: Any) -> None:
    data = json.loads(report(real("pipeline-split"), "json"))
    assert data["run"]["status"] == "finished"  # no supervisor: rank 0 wrote exit.json
    assert data["run"]["status_text"].startswith("finished")
    assert all(r["exit"]["status"] == "ok" for r in data["ranks"])


def test_report_and_diagnosis_import_neither_torch_nor_textual() -> None:
    import subprocess
    import sys

    code = (
        "import sys, shardtop.report, shardtop.diagnose, shardtop.report.tree_summary; "
        "print(sorted(m for m in ('torch', 'textual', 'lightning', 'deepspeed') if m in sys.modules))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def test_a_failure_that_is_no_oom_shows_its_error(tmp_path: Path) -> None:
    run = RunDirectory.create(tmp_path / "runs", "script", RunMeta(preset="script", command=("python", "train.py")))
    writer = EventWriter(event_file(run.events_dir, 0), 0)
    writer.write(Hello(pid=1, world_size=1, engine="plain"))
    error = "RuntimeError: Expected all tensors to be on the same device, but found cpu and cuda:0"
    writer.write(Exit(code=1, status="error", error=error))
    writer.close()
    md = report(run.path, "markdown")
    assert "<summary>Error on rank 0 (failed)</summary>" in md and error in md
    assert "## Out of memory" not in md


def test_unknown_format_is_refused() -> None:
    with pytest.raises(ValueError, match="expected one of text, markdown, json"):
        render_report(RunDirectory(Path("/nonexistent")), "html")


# -- a 100 000-module tree ------------------------------------------------------------------------------


def test_a_100k_module_report_stays_short_and_the_json_whole(tmp_path: Path) -> None:
    """The time the three take: ``bench/bench_costs.py``."""
    run = RunDirectory(big_tree_run(tmp_path))
    text = render_report(run, "text")
    md = render_report(run, "markdown")
    out = render_report(run, "json")
    tree = text[text.index("Shard tree") :]
    assert len(tree.splitlines()) < TREE_MAX_ROWS + 10
    assert "19999 × Block" in tree and "19999 × Block" in md
    data = json.loads(out)
    assert len(data["modules"]) == data["model"]["modules"] == 99_996
    assert len(out) < 25_000_000


# -- layout pieces -------------------------------------------------------------------------------------


def test_markdown_escapes_pipes_keeps_guides_and_fences_backticks() -> None:
    blocks = [
        Heading("Title", 1),
        Facts((("key", "a `span`"),)),
        Table(("module", "note"), (("  └─a|b", "x|y"),), code=frozenset({0})),
        Details("Trace <1>", ("line with ``` inside",)),
        Para("**bold** and `code`"),
    ]
    md = to_markdown(blocks)
    assert "- **key:** a `span`" in md
    assert "| `  └─a¦b` | x\\|y |" in md
    assert "<summary>Trace &lt;1&gt;</summary>" in md and "````text" in md
    text = to_text(blocks)
    assert "key: a span" in text and "bold and code" in text
    assert "  └─a|b  x|y" in text


def test_counts_are_short() -> None:
    assert [count(n) for n in (0, 999, 1000, 25_214_976, 1_050_624_000)] == ["0", "999", "1 K", "25.2 M", "1.05 B"]


def _linear_model(n: int) -> ShardModel:
    names, parents = ["", "net", *map(str, range(n)), "head"], [-1, 0, *([1] * n), 0]
    tree = Tree(
        tree_id=0,
        names=names,
        parents=parents,
        types=[0, 1, *([2] * n), 2],
        type_names=["Tel", "Sequential", "Linear"],
        params=[0, 0, *([10] * n), 5],
        bytes=[0, 0, *([40] * n), 20],
    )
    return ShardModel.build(tree, {}, tree_paths(names, parents))


def test_tree_summary_folds_and_marks_the_fold_holding_the_culprit() -> None:
    summary = summarize_tree(_linear_model(100), culprit="net.42")
    labels = [(r.label, r.type, r.note) for r in summary.rows]
    assert labels == [
        ("(root)", "Tel", ""),
        ("net", "Sequential", ""),
        ("net.0 … net.99", "100 × Linear", "✗ OOM in net.42"),
        ("head", "Linear", ""),
    ]
    assert summary.rows[2].params == 1000 and summary.rows[2].full_bytes == 4000


def test_tree_summary_keeps_the_culprit_past_the_row_limit() -> None:
    names = ["", *[f"m{i}" for i in range(30)]]
    parents = [-1, *([0] * 30)]
    tree = Tree(
        tree_id=0,
        names=names,
        parents=parents,
        types=[0, *[1 + i % 2 for i in range(30)]],
        type_names=["Root", "Linear", "Conv2d"],
        params=[0, *range(1, 31)],
        bytes=[0, *range(4, 124, 4)],
    )
    model = ShardModel.build(tree, {}, tree_paths(names, parents))
    summary = summarize_tree(model, culprit="m25", max_rows=10)
    assert len(summary.rows) == 10 and summary.hidden == 21
    assert (summary.rows[-1].label, summary.rows[-1].note) == ("m25", "✗ OOM")
