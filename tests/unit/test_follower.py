"""The one follower of a live run, and the first frame ``attach`` draws from the head of its events."""

from __future__ import annotations

from pathlib import Path

from shardtop.read.follower import RunFollower
from shardtop.read.shard_model import ShardModel
from shardtop.read.whole_run import read_run
from shardtop.rundir.event_files import event_file
from shardtop.rundir.event_lines import encode
from shardtop.rundir.events import Step
from shardtop.rundir.run_directory import RunDirectory
from shardtop.tui.run_frame import run_frame_lines
from tests.support.recorded import copy_runs


def append(run: Path, rank: int, event: object) -> None:
    with open(event_file(run / "events", rank), "ab") as f:
        f.write(encode(event))  # type: ignore[arg-type]


def test_the_follower_hands_out_a_new_model_only_when_something_changed(tmp_path: Path) -> None:
    path = copy_runs(tmp_path, "cpu/fsdp2-mlp")["cpu/fsdp2-mlp"]
    follower = RunFollower(RunDirectory(path))
    first = follower.poll()
    assert first is not None and first.step == 3 and first.meta.title == "fsdp2-mlp"
    assert follower.poll() is None and follower.model() is first, "nothing new: the same model"

    append(path, 0, Step(step=4, rank=0, host="vm", t=(first.state.last_t or 0) + 1))
    later = follower.poll()
    assert later is not None and later.step == 4 and later.meta is first.meta, "run.json is not parsed again"

    follower.run.update_meta(preset="renamed")  # written whole, by a rename, as every writer does
    renamed = follower.poll()
    assert renamed is not None and renamed.meta.title == "renamed", "a new run.json is parsed again"


def test_read_first_stops_at_the_limit_and_the_next_poll_reads_on(tmp_path: Path) -> None:
    path = copy_runs(tmp_path, "h200x2/zero3-linear")["h200x2/zero3-linear"]
    run = RunDirectory(path)
    follower = RunFollower(run)
    head = follower.read_first(limit=4096)
    assert follower.unread_bytes > 0 and head.tree is None, "the tree lies past the first 4 KiB"
    whole = follower.poll()
    assert whole is not None and follower.unread_bytes == 0
    assert whole.state == read_run(run).state


def test_attach_frame_shows_the_header_the_bars_and_the_tree_at_the_oom(tmp_path: Path) -> None:
    path = copy_runs(tmp_path, "h200x2/zero3-linear")["h200x2/zero3-linear"]
    follower = RunFollower(RunDirectory(path))
    model = follower.read_first()
    lines = run_frame_lines(model, ShardModel.of(model.state), follower.run, 120, 40, clock=lambda: 0.0)
    text = "\n".join(lines)
    assert len(lines) <= 40 and all(len(line) <= 120 for line in lines)
    assert lines[0].startswith("zero3-linear  ✗ failed") and "2 ranks" in lines[1]
    assert " r0 cuda:0 ✗ OOM" in text and " r1 cuda:1 ✗ OOM" in text
    assert "Shard tree · model.net.15330" in text
    assert any("15330  ✗ OOM" in line for line in lines), "the culprit's line, marked, is on the frame"
    assert lines[-1].startswith(" ✗ OOM: Rank 0 ran out of memory"), "the first OOM, in the headless words"
