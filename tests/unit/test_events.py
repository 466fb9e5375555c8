"""The event contract: what a reader does with real, torn, foreign and newer lines."""

from __future__ import annotations

import json
from pathlib import Path

import msgspec
import pytest

from shardtop.read.oom_story import OomStory
from shardtop.rundir.event_files import EventReader, EventWriter, event_file, read_all
from shardtop.rundir.events import SCHEMA_VERSION, Exit, Hello, Memory, Oom, Step, Tree, tree_paths
from shardtop.rundir.memory_figures import GpuMemory, MemorySplit


def writer(tmp_path: Path, rank: int = 0) -> EventWriter:
    return EventWriter(event_file(tmp_path, rank), rank, host="box")


def test_writer_stamps_rank_host_time_and_version(tmp_path: Path) -> None:
    w = writer(tmp_path, rank=3)
    w.write(Hello(pid=42, world_size=4, device="cuda:3", engine="zero3"))
    line = json.loads(event_file(tmp_path, 3).read_text())
    assert line["kind"] == "hello"
    assert (line["rank"], line["host"], line["v"]) == (3, "box", SCHEMA_VERSION)
    assert line["t"] > 0
    assert event_file(tmp_path, 3).stat().st_mode & 0o077 == 0


def test_an_event_read_back_cannot_be_changed(tmp_path: Path) -> None:
    """What a rank wrote is what every view reads: no reader can change it for the others, nor can the
    writer's stamp change the event its caller still holds."""
    sample = Memory(device="cuda:0", allocated=5, gpus=[GpuMemory(index=0, used=7)], split=MemorySplit(allocated=5))
    writer(tmp_path, rank=2).write(sample)
    (read,), _ = read_all(tmp_path)
    assert isinstance(read, Memory) and (read.rank, read.host, read.allocated) == (2, "box", 5)
    assert read.gpus is not None and read.split is not None
    with pytest.raises(AttributeError):
        read.allocated = 0  # type: ignore[misc]
    with pytest.raises(AttributeError):
        read.gpus[0].used = 0  # type: ignore[misc]
    with pytest.raises(AttributeError):
        read.split.allocated = 0  # type: ignore[misc]
    assert (read.allocated, read.gpus[0].used, read.split.allocated) == (5, 7, 5)
    assert (sample.rank, sample.host, sample.t) == (0, "", 0.0)


def test_reader_returns_only_new_events_across_files(tmp_path: Path) -> None:
    w0, w1 = writer(tmp_path, 0), writer(tmp_path, 1)
    reader = EventReader(tmp_path)
    w0.write(Step(step=1))
    assert [e.step for e in reader.read_new()] == [1]
    assert reader.read_new() == []
    w0.write(Step(step=2))
    w1.write(Step(step=2))
    got = sorted((e.rank, e.step) for e in reader.read_new())
    assert got == [(0, 2), (1, 2)]


def test_torn_last_line_is_held_back_then_completed(tmp_path: Path) -> None:
    path = event_file(tmp_path, 0)
    line = msgspec.json.encode(Step(step=7, rank=0)) + b"\n"
    path.write_bytes(line[:10])
    reader = EventReader(tmp_path)
    assert reader.read_new() == []
    assert reader.skipped_total == 0
    with open(path, "ab") as f:
        f.write(line[10:])
    assert [e.step for e in reader.read_new()] == [7]


def test_torn_line_of_a_dead_writer_is_counted_not_raised(tmp_path: Path) -> None:
    path = event_file(tmp_path, 0)
    good = msgspec.json.encode(Step(step=1)) + b"\n"
    path.write_bytes(good + b'{"kind":"step","st')
    events, skipped = read_all(tmp_path)
    assert [e.step for e in events] == [1]
    assert skipped["torn"] == 1


def test_garbage_unknown_kinds_and_newer_versions_are_skipped_and_counted(tmp_path: Path) -> None:
    path = event_file(tmp_path, 0)
    lines = [
        b"not json at all",
        b'{"kind":"step","step":"three"}',
        b'{"kind":"gradient-histogram","v":1,"rank":0}',
        b'{"kind":"step","v":%d,"rank":0,"step":1,"new_field":[1,2]}' % (SCHEMA_VERSION + 1),
        b'\x00\xff\xfe',
        msgspec.json.encode(Exit(code=0, status="ok")),
    ]
    path.write_bytes(b"\n".join(lines) + b"\n")
    events, skipped = read_all(tmp_path)
    assert [type(e).__name__ for e in events] == ["Exit"]
    assert skipped == {"bad": 3, "unknown": 1, "newer": 1, "torn": 0}


def test_unknown_fields_of_a_known_kind_are_ignored(tmp_path: Path) -> None:
    event_file(tmp_path, 0).write_bytes(b'{"kind":"step","v":1,"rank":0,"step":5,"grad_norm":1.5}\n')
    events, skipped = read_all(tmp_path)
    assert [e.step for e in events] == [5] and sum(skipped.values()) == 0


def test_oom_and_exit_round_trip(tmp_path: Path) -> None:
    w = writer(tmp_path)
    w.write(
        Oom(phase="setup", module="net.3", module_type="Linear", requested_bytes=2**20, attributed_by="apply-frame")
    )
    w.write(Exit(code=1, status="oom", error="OutOfMemoryError"))
    events, _ = read_all(tmp_path)
    oom, exit_ = events
    assert isinstance(oom, Oom) and oom.module == "net.3" and oom.requested_bytes == 2**20
    assert isinstance(exit_, Exit) and exit_.status == "oom"


def test_words_this_version_does_not_know_are_kept_and_said_as_written(tmp_path: Path) -> None:
    """Phases and attributions are typed where shardtop makes them, but a reader keeps an OOM whose words a
    newer writer (or a user's own phase) chose, and says them as written."""
    event_file(tmp_path, 0).write_bytes(
        b'{"kind":"oom","v":1,"rank":0,"phase":"checkpoint","attributed_by":"hook-frame",'
        b'"message":"CUDA out of memory"}\n'
    )
    (oom,), skipped = read_all(tmp_path)
    assert isinstance(oom, Oom) and sum(skipped.values()) == 0
    story = OomStory(oom, None)
    assert (story.found_by, story.when) == ("hook-frame", "during checkpoint")
    known = OomStory(msgspec.structs.replace(oom, attributed_by="tracker"), None)
    # said of an OOM in forward too (the loss on a module's outputs), so not "the module backward was in"
    assert known.found_by == (
        "named by the module tracker (the module whose tensors the failing operation was working on)"
    )


def test_tree_paths_rebuild_dotted_paths() -> None:
    tree = Tree(tree_id=0, names=["", "net", "0", "1", "head"], parents=[-1, 0, 1, 1, 0],
                types=[0, 1, 2, 2, 2], type_names=["M", "Sequential", "Linear"], params=[0] * 5, bytes=[0] * 5)
    assert tree_paths(tree.names, tree.parents) == ["", "net", "net.0", "net.1", "head"]
