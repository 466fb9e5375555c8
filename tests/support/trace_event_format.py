"""The trace event format's rules, checked on a trace as Perfetto and chrome://tracing read it.

Written from the format's documents, not from shardtop's output:

- "Trace Event Format" (the Google document that catapult's ``docs/trace-event-format.md`` points
  to; its sections are named below as [spec: section]);
- Perfetto's "Visualizing external trace formats" (docs/getting-started/other-formats.md, Chrome JSON
  format) and its FAQ on overlapping events, named [perfetto].

``problems(trace)`` returns every rule the trace breaks, in words; an empty list is a valid trace.
"""

from __future__ import annotations

import math
from collections import defaultdict
from typing import Any

PHASES = frozenset("BEXiICbnestfPNODMVvRc()")
"""Every event type the spec defines [spec: Event Descriptions]; ``I`` is the deprecated instant."""

METADATA_ARGS = {
    "process_name": ("name", str),
    "process_labels": ("labels", str),
    "process_sort_index": ("sort_index", int),
    "thread_name": ("name", str),
    "thread_sort_index": ("sort_index", int),
}
"""The metadata events and the one argument each carries [spec: Metadata Events]."""

INSTANT_SCOPES = frozenset({"g", "p", "t"})
"""Global, process, thread; absent means thread [spec: Instant Events]."""

DISPLAY_TIME_UNITS = frozenset({"ms", "ns"})
"""[spec: JSON Object Format] ``displayTimeUnit``."""


def _number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _event_problems(i: int, e: Any) -> list[str]:
    """The rules of one event on its own."""
    if not isinstance(e, dict):
        return [f"event {i}: not an object"]
    found = []
    ph = e.get("ph")
    where = f"event {i} ({e.get('name')!r}, ph {ph!r})"
    # [spec: Event Descriptions] ph is a single character naming the event type
    if not isinstance(ph, str) or len(ph) != 1 or ph not in PHASES:
        return [f"{where}: ph is not one of the format's event types"]
    # [spec: Event Descriptions] name is the event's name, as displayed
    if not isinstance(e.get("name"), str):
        found.append(f"{where}: name is not a string")
    # [spec: Event Descriptions] pid and tid: the process and thread ids that output the event
    for key in ("pid", "tid"):
        if key in e and not (isinstance(e[key], int) and not isinstance(e[key], bool)):
            found.append(f"{where}: {key} is not an integer")
    if "pid" not in e:
        found.append(f"{where}: no pid")
    # [spec: Event Descriptions] cat: a comma-separated list of categories
    if "cat" in e and not isinstance(e["cat"], str):
        found.append(f"{where}: cat is not a string")
    # [spec: Event Descriptions] args: any arguments, an object
    if "args" in e and not isinstance(e["args"], dict):
        found.append(f"{where}: args is not an object")
    # [spec: Event Descriptions] ts: the tracing clock timestamp, in microseconds; metadata events need none
    if ph != "M" and not _number(e.get("ts")):
        found.append(f"{where}: ts is not a finite number of microseconds")
    if ph == "X":
        # [spec: Complete Events] dur: the tracing clock duration, in microseconds
        if not _number(e.get("dur")) or e["dur"] < 0:
            found.append(f"{where}: a complete event without a duration of zero or more microseconds")
        if "tid" not in e:
            found.append(f"{where}: a slice without a thread")
    elif ph in ("i", "I"):
        # [spec: Instant Events] s: the scope, g, p or t (thread when absent); an instant has no duration
        if "s" in e and e["s"] not in INSTANT_SCOPES:
            found.append(f"{where}: scope {e['s']!r} is not g, p or t")
        if "dur" in e:
            found.append(f"{where}: an instant with a duration")
        if e.get("s", "t") == "t" and "tid" not in e:
            found.append(f"{where}: a thread instant without a thread")
    elif ph == "C":
        # [spec: Counter Events] args: each series' name and its numeric value
        args = e.get("args")
        if not isinstance(args, dict) or not args:
            found.append(f"{where}: a counter without series in args")
        else:
            found += [f"{where}: series {k!r} has value {v!r}, not a number" for k, v in args.items() if not _number(v)]
    elif ph == "M":
        # [spec: Metadata Events] the five names and their argument
        rule = METADATA_ARGS.get(e.get("name", ""))
        if rule is None:
            found.append(f"{where}: metadata of an unknown name")
        else:
            key, kind = rule
            value = (e.get("args") or {}).get(key)
            if not isinstance(value, kind) or isinstance(value, bool):
                found.append(f"{where}: args.{key} is not a {kind.__name__}")
    return found


def _nesting_problems(slices: dict[tuple[int, int], list[tuple[float, float, str]]]) -> list[str]:
    """[spec: Duration Events, Complete Events] slices of one thread nest: B/E pairs must, and a complete
    event is such a pair in one; [perfetto] "Perfetto's data model requires duration events (B/E pairs and X
    events) to nest, as mandated by the spec"; overlapping ones are drawn on an overflow track."""
    found = []
    for (pid, tid), spans in slices.items():
        stack: list[tuple[float, float, str]] = []
        for start, end, name in sorted(spans, key=lambda s: (s[0], -s[1])):
            while stack and start >= stack[-1][1]:
                stack.pop()
            if stack and end > stack[-1][1]:
                found.append(f"pid {pid} tid {tid}: slice {name!r} [{start}, {end}] overlaps {stack[-1][2]!r} "
                             f"[{stack[-1][0]}, {stack[-1][1]}] without nesting in it")
            stack.append((start, end, name))
    return found


def _duration_problems(events: list[dict[str, Any]]) -> tuple[list[str], dict[tuple[int, int], list[Any]]]:
    """[spec: Duration Events] a B comes before its E on the same thread, in increasing time; every B is ended."""
    found: list[str] = []
    open_by_thread: dict[tuple[int, int], list[tuple[float, str]]] = defaultdict(list)
    slices: dict[tuple[int, int], list[tuple[float, float, str]]] = defaultdict(list)
    last_ts: dict[tuple[int, int], float] = {}
    for e in events:
        ph = e.get("ph")
        if ph not in ("B", "E", "X"):
            continue
        thread = (e.get("pid", 0), e.get("tid", 0))
        ts = e.get("ts", 0)
        if ph == "X":
            slices[thread].append((ts, ts + e.get("dur", 0), e.get("name", "")))
            continue
        if thread in last_ts and ts < last_ts[thread]:
            found.append(f"pid {thread[0]} tid {thread[1]}: duration events out of time order at ts {ts}")
        last_ts[thread] = ts
        if ph == "B":
            open_by_thread[thread].append((ts, e.get("name", "")))
        elif not open_by_thread[thread]:
            found.append(f"pid {thread[0]} tid {thread[1]}: an E at ts {ts} with no B open")
        else:
            start, name = open_by_thread[thread].pop()
            slices[thread].append((start, ts, name))
    for thread, still in open_by_thread.items():
        found += [f"pid {thread[0]} tid {thread[1]}: B {name!r} at ts {ts} never ended" for ts, name in still]
    return found, slices


def problems(trace: Any) -> list[str]:
    """Every rule of the format ``trace`` (a parsed JSON file) breaks."""
    # [spec: JSON Object Format] an object whose traceEvents is the array of events; or the bare array
    if isinstance(trace, list):
        events = trace
    elif isinstance(trace, dict) and isinstance(trace.get("traceEvents"), list):
        events = trace["traceEvents"]
        unit = trace.get("displayTimeUnit")
        if unit is not None and unit not in DISPLAY_TIME_UNITS:
            return [f"displayTimeUnit {unit!r} is not ms or ns"]
        if "otherData" in trace and not isinstance(trace["otherData"], dict):
            return ["otherData is not an object"]
    else:
        return ["neither an array of events nor an object with a traceEvents array"]
    found = [p for i, e in enumerate(events) for p in _event_problems(i, e)]
    if found:
        return found
    duration, slices = _duration_problems(events)
    return duration + _nesting_problems(slices)
