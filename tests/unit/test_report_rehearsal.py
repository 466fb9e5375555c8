"""The report of a rehearsal, on real CPU rehearsals (``tests/fixtures/runs/cpu-rehearsal``): the
header says which ranks of how many were rehearsed on what, instead of a world size; what a
rehearsal cannot show is said once; the JSON carries it as ``rehearsal``; ``shardtop runs`` marks it.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from shardtop.report import render_report
from shardtop.rundir.run_directory import RunDirectory
from tests.support.cli import shardtop
from tests.support.recorded import copy_runs

REHEARSED = "cpu-rehearsal/fsdp2-mlp"
"""fsdp2-mlp rehearsed as ranks 0 and 3 of 4, one CPU process after the other."""
REAL = "cpu/fsdp2-mlp"
"""The same preset run for real on 2 CPU processes: the close case."""

HEADLINE = "ranks 0, 3 of 4, rehearsed on CPU; collectives not run"
CAVEAT_WORDS = ("fake process group", "NCCL's buffers and communicators", "losses", "loss-scale skips",
                "clipping", "routing", "ranks not rehearsed were not run")  # fmt: skip


@pytest.fixture
def runs(tmp_path: Path) -> dict[str, Path]:
    return copy_runs(tmp_path / "runs", REHEARSED, REAL)


def test_the_text_report_heads_a_rehearsal_with_what_was_rehearsed(runs: dict[str, Path]) -> None:
    text = render_report(RunDirectory(runs[REHEARSED]), "text")
    head = text[: text.index("Findings\n")]
    assert re.search(rf"^rehearsal:\s+{re.escape(HEADLINE)}$", head, re.MULTILINE), head
    assert not re.search(r"^world size:", head, re.MULTILINE)
    assert re.search(r"^host:\s+vm$", head, re.MULTILINE)
    assert text.count("fake process group") == 1, "the caveat is said once"
    caveat = next(line for line in head.splitlines() if "fake process group" in line)
    assert caveat.startswith("⚠ ") and all(w in caveat for w in CAVEAT_WORDS), caveat
    # the per-rank table and the tree speak of the rehearsed ranks only
    ranks = text[text.index("Per rank\n") :]
    assert re.search(r"^0 +vm +cpu", ranks, re.MULTILINE) and re.search(r"^3 +vm +cpu", ranks, re.MULTILINE)
    assert not re.search(r"^[12] +vm", ranks, re.MULTILINE)
    assert "rank 0  rank 3  state" in text[text.index("Shard tree\n") :]


def test_the_markdown_report_says_it_once_too(runs: dict[str, Path]) -> None:
    md = render_report(RunDirectory(runs[REHEARSED]), "markdown")
    assert f"- **rehearsal:** {HEADLINE}" in md and "**world size:**" not in md
    assert md.count("fake process group") == 1


def test_a_real_run_keeps_its_world_size_and_says_nothing_of_rehearsals(runs: dict[str, Path]) -> None:
    text = render_report(RunDirectory(runs[REAL]), "text")
    assert re.search(r"^world size:\s+2 rank\(s\) on vm; devices cpu$", text, re.MULTILINE)
    assert "rehears" not in text and "fake process group" not in text
    assert json.loads(render_report(RunDirectory(runs[REAL]), "json"))["rehearsal"] is None


def test_the_json_report_carries_the_rehearsal(runs: dict[str, Path]) -> None:
    data = json.loads(render_report(RunDirectory(runs[REHEARSED]), "json"))
    rehearsal = data["rehearsal"]
    assert {k: rehearsal[k] for k in ("world_size", "ranks", "on")} == {"world_size": 4, "ranks": [0, 3], "on": "CPU"}
    assert all(w in rehearsal["caveat"] for w in CAVEAT_WORDS)
    assert data["world_size"] == 4 and [r["rank"] for r in data["ranks"]] == [0, 3]
    documented = (Path(__file__).parents[2] / "docs" / "report-json.md").read_text()
    assert "| `rehearsal` | object \\| null |" in documented
    for key in rehearsal:
        assert f"| `{key}` |" in documented[documented.index("### `rehearsal`") :], key


def test_shardtop_runs_marks_the_rehearsal(runs: dict[str, Path]) -> None:
    r = shardtop("runs", runs_dir=runs[REHEARSED].parent)
    assert r.returncode == 0, r.stderr
    header, *lines = r.stdout.splitlines()
    cols = header.index("RANKS"), header.index("STEP")
    by_id = {line.split()[0]: line[cols[0] : cols[1]].strip() for line in lines}
    assert by_id[runs[REHEARSED].name] == "2/4 rehearsed"
    assert by_id[runs[REAL].name] == "2"
