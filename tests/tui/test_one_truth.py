"""Every view tells every recorded run the same way: the TUI, the report in all three formats and `runs`.

For each run under tests/fixtures/runs (real runs on H200s and CPUs), the first OOM's rank and
module, the engine, the status, and each module's state and device per rank are read back from
what each view shows, and must agree.
"""

from __future__ import annotations

import contextlib
import io
import json
import re
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from shardtop.cli import main
from shardtop.report import gather
from shardtop.report.blocks import report_blocks
from shardtop.report.document import to_markdown, to_text
from shardtop.report.json_report import to_json
from shardtop.rundir.run_directory import RunDirectory
from shardtop.tui.app import ShardtopApp
from shardtop.tui.screens.run_view import RunScreen
from shardtop.tui.widgets.oom_panel import OomPanel
from shardtop.tui.widgets.rank_memory import RankMemory
from shardtop.tui.widgets.run_header import RunHeader
from shardtop.tui.widgets.shard_tree import ShardTree
from tests.support.recorded import H200_HOST, RecordedHost, recorded_h200
from tests.support.waiting import wait_for

FIXTURES = Path(__file__).parents[1] / "fixtures" / "runs"
RECORDED = sorted(p for p in FIXTURES.glob("*/*") if (p / "run.json").is_file())


@dataclass(frozen=True)
class Told:
    """What one view says about a run."""

    engine: str | None
    status: str | None
    oom_rank: int | None
    oom_module: str | None
    """As the view writes it (the root is ``(root)``)."""


def _copy(run: Path, tmp_path: Path) -> Path:
    dest = tmp_path / "runs" / run.name
    shutil.copytree(run, dest)
    return dest


def _row(text: str, key: str, sep: str = ":") -> str | None:
    found = re.search(rf"^{re.escape(key)}{sep}\s*(.*)$", text, re.MULTILINE)
    return found.group(1).strip() if found else None


def from_json(data: dict[str, Any]) -> Told:
    oom = data["oom"]
    module = oom["module"] if oom else None
    return Told(
        engine=data["engine"],
        status=data["run"]["status_text"],
        oom_rank=oom["rank"] if oom else None,
        oom_module=(module or "(root)") if module is not None else None,
    )


def _module_of(cell: str | None) -> str | None:
    """``model.net.15330 (Linear)`` or ``not known: …`` -> the path, or None."""
    if cell is None or cell.startswith("not known"):
        return None
    return re.sub(r" \([^)]*\)$", "", cell).strip("`")


def from_text(text: str) -> Told:
    oom = text[text.index("Out of memory\n") :] if "Out of memory\n" in text else ""
    rank = _row(oom, "rank") if oom else None
    engine = _row(text, "engine")
    return Told(
        engine=engine.split(" (")[0] if engine and engine != "not known yet" else None,
        status=_row(text, "status"),
        oom_rank=int(rank.split()[0].rstrip(",")) if rank else None,
        oom_module=_module_of(_row(oom, "module")) if oom else None,
    )


def from_markdown(md: str) -> Told:
    plain = re.sub(r"^- \*\*([^*]+):\*\* ", r"\1: ", md, flags=re.MULTILINE)
    return from_text(plain.replace("## Out of memory", "Out of memory"))


def rows_named(tree: str) -> Callable[[str, str], list[str]]:
    """The report tree's rows of a module name and type: its guides (``│├└─``), the name, the type, more.

    The rows are indexed by name once: a tree of 18 000 modules is looked up 18 000 times.
    """
    by_name: dict[str, list[tuple[str, str]]] = {}
    for line in tree.split("\n"):
        rest = line.lstrip("│├└─ ")
        if rest.split(maxsplit=1):
            by_name.setdefault(rest.split(maxsplit=1)[0], []).append((line, rest))

    def rows(name: str, kind: str) -> list[str]:
        found = []
        for line, rest in by_name.get(name, []):
            after = rest[len(name) :]
            gap = len(after) - len(after.lstrip())
            typed = after[gap:].startswith(kind) and after[gap + len(kind) : gap + len(kind) + 1].isspace()
            if (gap >= 1 and typed) if kind else gap >= 2:
                found.append(line)
        return found

    return rows


def from_runs(out: str, run_id: str) -> tuple[str, str]:
    """(status, note) of the run's line in `shardtop runs`."""
    header, *lines = out.splitlines()
    line = next(x for x in lines if x.startswith(run_id))
    cols = {name: header.index(name) for name in ("STATUS", "RANKS", "NOTE")}
    return line[cols["STATUS"] : cols["RANKS"]].strip(), line[cols["NOTE"] :].strip()


async def from_tui(
    root: Path, run: Path
) -> tuple[Told, dict[str, list[tuple[int, str, str]]], dict[str, tuple[str, str]]]:
    app = ShardtopApp(
        root, run=str(run), read_only=True, gpu_source=recorded_h200(),  # type: ignore[arg-type]
        host_probe=RecordedHost(H200_HOST),  # type: ignore[arg-type]
    )
    async with app.run_test(size=(160, 48)) as pilot:
        await wait_for(
            pilot, lambda: isinstance(app.screen, RunScreen) and app.screen.snapshot is not None, what="the run"
        )
        screen = app.screen
        assert isinstance(screen, RunScreen)
        header = screen.query_one(RunHeader).info
        assert header is not None
        panel = screen.query_one(OomPanel)
        tree = screen.query_one(ShardTree).model
        cells: dict[str, list[tuple[int, str, str]]] = {}
        placed: dict[str, tuple[str, str]] = {}
        if tree is not None:
            for row, path in enumerate(tree.paths):
                if tree.tree.params[row]:
                    cells[path] = [(c.rank, c.state, c.device) for c in tree.rank_cells(row)]
                p = tree.placement(row)
                placed[path] = (p.state, p.device)
        statuses = [r.status.state for r in screen.query_one(RankMemory).rows]
        assert len(statuses) == len(screen.snapshot.model.ranks)  # type: ignore[union-attr]
        story = panel.oom
        module = story.module if story is not None else None
        told = Told(
            engine=None if header.engine == "-" else header.engine,
            status=header.status,
            oom_rank=story.rank if story is not None else None,
            oom_module=(module or "(root)") if module is not None else None,
        )
    return told, cells, placed


@pytest.mark.parametrize("run", RECORDED, ids=[f"{p.parent.name}/{p.name}" for p in RECORDED])
async def test_every_view_tells_the_same_facts(run: Path, tmp_path: Path) -> None:
    path = _copy(run, tmp_path)
    facts = gather(RunDirectory(path))  # what `shardtop report` renders, in each of its formats
    data = json.loads(to_json(facts))
    told = from_json(data)
    text = to_text(report_blocks(facts))
    assert from_text(text) == told, "text report"
    assert from_markdown(to_markdown(report_blocks(facts))) == told, "markdown report"

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(["runs", "--runs-dir", str(path.parent)]) == 0
    status, note = from_runs(out.getvalue(), path.name)
    assert status == told.status, "runs: the status"
    if told.oom_rank is not None:
        assert note.startswith(f"OOM on rank {told.oom_rank} during "), "runs: the first OOM"
        if told.oom_module is not None:
            assert f" in {told.oom_module}" in note
    else:
        assert "OOM" not in note

    tui, cells, placed = await from_tui(path.parent, path)
    assert tui == told, "the TUI"

    for module in data["modules"]:
        if module["ranks"] and module["params"]:  # a row of saved activations alone holds no parameters
            expected = [(r["rank"], r["state"], r["device"]) for r in module["ranks"]]
            assert cells[module["path"]] == expected, module["path"]
    rows = rows_named(text[text.index("Shard tree\n") :])
    checked = 0
    types = {m["path"]: m["type"] for m in data["modules"]}
    for path_, (state, device) in placed.items():
        label = path_.rsplit(".", 1)[-1] if path_ else "(root)"
        lines = rows(label, types.get(path_, ""))
        if len(lines) == 1 and state:  # one row of that name and type (``0`` is blocks.0 and blocks.0.mlp.0)
            assert f"  {state}  " in lines[0] and device in lines[0], (path_, lines[0])
            checked += 1
    assert checked or not any(state for state, _ in placed.values()), "the report's tree shows the TUI's placement"
