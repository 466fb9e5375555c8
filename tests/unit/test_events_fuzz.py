"""The event reader never raises, whatever a rank's file holds: it returns events or counts skips.

Fuzzed with hypothesis (bounded examples): arbitrary bytes, torn lines, valid
events with garbage in their fields, lines from a newer schema, and files
read while they are being written.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

import msgspec
from hypothesis import example, given, settings
from hypothesis import strategies as st

from shardtop.rundir.event_files import EventReader, event_file, read_all
from shardtop.rundir.event_lines import SkipReason, decode, encode
from shardtop.rundir.events import (
    EVENT_TYPES,
    SCHEMA_VERSION,
    Event,
    Exit,
    Fault,
    Hello,
    Memory,
    Oom,
    Phase,
    Step,
)

FUZZ = settings(max_examples=150, deadline=None)

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=20),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=12,
)

valid_events = st.one_of(
    st.builds(Step, step=st.integers(0, 10**6), loss=st.none() | st.floats(allow_nan=False, allow_infinity=False)),
    st.builds(Phase, phase=st.sampled_from(["setup", "forward", "backward", "optimizer"]), step=st.integers(0, 99)),
    st.builds(Memory, host_rss=st.integers(0, 2**40), allocated=st.none() | st.integers(0, 2**40)),
    st.builds(Hello, pid=st.integers(1, 2**22), world_size=st.integers(1, 8), engine=st.sampled_from(["zero3", "ddp"])),
    st.builds(Oom, phase=st.just("forward"), module=st.none() | st.text(max_size=30), message=st.text(max_size=80)),
    st.builds(Fault, part=st.sampled_from(["shards", "events", "memory"]), error=st.text(max_size=80)),
    st.builds(Exit, code=st.integers(-255, 255), status=st.sampled_from(["ok", "error", "oom", "interrupted"])),
)


def read_bytes(data: bytes) -> tuple[list[Any], dict[str, int]]:
    with tempfile.TemporaryDirectory() as d:
        event_file(Path(d), 0).write_bytes(data)
        return read_all(Path(d))


@FUZZ
@given(st.binary(max_size=3000))
def test_arbitrary_bytes_are_events_or_counted_skips(data: bytes) -> None:
    events, skipped = read_bytes(data)
    assert all(isinstance(e, EVENT_TYPES) for e in events)
    lines = [line for line in data.split(b"\n") if line.strip()]
    assert len(events) + sum(skipped.values()) == len(lines)


@FUZZ
@given(st.lists(valid_events, min_size=1, max_size=12), st.data())
def test_a_file_torn_anywhere_gives_the_whole_lines_before_the_tear(events: list[Event], data: st.DataObject) -> None:
    lines = [encode(e) for e in events]
    blob = b"".join(lines)
    cut = data.draw(st.integers(0, len(blob)))
    read, skipped = read_bytes(blob[:cut])
    whole = sum(1 for end in _line_ends(lines) if end <= cut)
    assert [encode(e) for e in read] == lines[:whole]
    assert skipped["torn"] == (1 if cut not in (0, *_line_ends(lines)) else 0)
    assert sum(skipped.values()) == skipped["torn"]


def _line_ends(lines: list[bytes]) -> list[int]:
    ends, total = [], 0
    for line in lines:
        total += len(line)
        ends.append(total)
    return ends


@FUZZ
@given(valid_events, st.data())
def test_garbage_in_a_known_event_s_fields_is_an_event_or_a_bad_line(event: Event, data: st.DataObject) -> None:
    fields = json.loads(encode(event))
    name = data.draw(st.sampled_from(sorted(fields)))
    fields[name] = data.draw(json_values)
    result = decode(json.dumps(fields).encode())
    assert isinstance(result, (*EVENT_TYPES, str))
    if isinstance(result, str):
        assert result in (SkipReason.BAD, SkipReason.UNKNOWN, SkipReason.NEWER)


@FUZZ
@given(
    st.integers(SCHEMA_VERSION + 1, 10**6),
    st.text(max_size=12) | st.sampled_from(["step", "oom", "exit", "fault"]),
    st.dictionaries(st.text(max_size=8), json_values, max_size=5),
)
def test_lines_of_a_newer_schema_are_skipped_as_newer(version: int, kind: str, extra: dict[str, Any]) -> None:
    line = json.dumps({**extra, "kind": kind, "v": version, "rank": 0}).encode()
    assert decode(line) == SkipReason.NEWER


@FUZZ
@given(st.dictionaries(st.text(max_size=8), json_values, max_size=5), json_values)
@example(extra={}, kind=[1])  # a list is no kind: it once raised TypeError (unhashable) in the reader
def test_unknown_or_odd_kinds_are_skipped_not_raised(extra: dict[str, Any], kind: Any) -> None:
    line = json.dumps({**extra, "kind": kind, "v": SCHEMA_VERSION}).encode()
    result = decode(line)
    assert result == SkipReason.UNKNOWN or kind in {t.__struct_config__.tag for t in EVENT_TYPES}


@FUZZ
@given(st.lists(valid_events, max_size=10), st.lists(st.integers(1, 200), max_size=10), st.binary(max_size=40))
def test_reading_while_the_file_is_written_loses_and_repeats_nothing(
    events: list[Event], chunks: list[int], garbage: bytes
) -> None:
    blob = b"".join(encode(e) for e in events) + garbage.replace(b"\n", b"")
    with tempfile.TemporaryDirectory() as d:
        path = event_file(Path(d), 0)
        path.touch()
        reader = EventReader(Path(d))
        got: list[Any] = []
        offset = 0
        for size in [*chunks, len(blob)]:
            with open(path, "ab") as f:
                f.write(blob[offset : offset + size])
            offset += size
            got.extend(reader.read_new())
        reader.finish()
    assert [encode(e) for e in got] == [encode(e) for e in events]
    assert reader.skipped["torn"] == (1 if garbage.replace(b"\n", b"").strip() else 0)


def test_a_line_cut_back_by_its_writer_is_read_again_whole(tmp_path: Path) -> None:
    """A writer that hit a full disk cuts its torn line off; a reader that saw the torn part recovers."""
    path = event_file(tmp_path, 0)
    first, second = encode(Step(step=1)), encode(Step(step=2))
    path.write_bytes(first + second[:7])
    reader = EventReader(tmp_path)
    assert [e.step for e in reader.read_new()] == [1]
    with open(path, "r+b") as f:
        f.truncate(len(first))
    assert reader.read_new() == []
    with open(path, "ab") as f:
        f.write(second)
    assert [e.step for e in reader.read_new()] == [2]
    assert reader.skipped_total == 0


def test_msgspec_rejects_what_the_reader_counts_as_bad() -> None:
    """The decoder's errors are all ``msgspec.DecodeError`` (validation errors included)."""
    assert issubclass(msgspec.ValidationError, msgspec.DecodeError)
