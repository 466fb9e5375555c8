"""The event contract between training ranks and everything that reads a run.

Ranks append one JSON object per line to ``events/rank-<N>.jsonl`` in the run
directory; the TUI, ``shardtop report`` and ``shardtop runs`` read them back.
This module is the only one both sides import, so it imports neither torch nor
textual.

Every event carries the schema version ``v``, the ``rank``, the ``host`` and a
wall-clock timestamp ``t``.  Readers skip (and count) lines they cannot parse,
kinds they do not know and versions newer than theirs: a torn last line or a
newer writer never crashes a reader.

The module tree is written once per structure (``Tree``), column-wise, so a
100 000-module model stays small; per-rank arrays in ``Shards`` are aligned
with the tree's rows by index and name the tree they belong to (``tree_id``).
"""

from __future__ import annotations

import os
import socket
import threading
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Union

import msgspec

SCHEMA_VERSION = 1
"""Bumped when a field changes meaning; new optional fields do not bump it."""

EVENT_FILE_PREFIX = "rank-"
EVENT_FILE_SUFFIX = ".jsonl"

Scalar = Union[str, int, float, bool, None]


class Event(msgspec.Struct, tag_field="kind", kw_only=True):
    """Fields every event carries."""

    v: int = SCHEMA_VERSION
    rank: int = 0
    host: str = ""
    t: float = 0.0


class Hello(Event, tag="hello"):
    """A rank came up: who it is and what it runs."""

    pid: int
    world_size: int
    local_rank: int = 0
    node_rank: int = 0
    device: str = "cpu"
    engine: str = ""
    """fsdp1, fsdp2, zero1, zero2, zero3, ddp, manual or plain; may be refined by Shards."""
    strategy: str = ""
    """What the user asked for, e.g. ``ModelParallelStrategy`` or ``deepspeed_stage_3``."""
    program: str = ""
    versions: dict[str, str] = {}
    slurm_job_id: str = ""
    """SLURM's job, step and node of the rank ("" outside SLURM)."""
    slurm_step_id: str = ""
    slurm_node: str = ""
    host_memory: int | None = None
    """The host's physical memory in bytes (None: not read)."""
    host_memory_limit: int | None = None
    """The memory limit of the rank's cgroup (its container or job), where lower than ``host_memory``."""
    alloc_conf: str | None = None
    """``PYTORCH_CUDA_ALLOC_CONF`` (or ``PYTORCH_ALLOC_CONF``) as the rank saw it; None where unset."""


class Tree(Event, tag="tree"):
    """The module structure, column-wise, in pre-order (a parent precedes its children).

    ``params`` and ``bytes`` count a module's *own* parameters (not its
    children's) at their full, unsharded size.  Wrapper modules the engines add
    (FSDP, DDP, DeepSpeed engine) are not rows: the rows are the user's modules.
    """

    tree_id: int
    names: list[str]
    """Last path segment of each module; the root's is ``""``."""
    parents: list[int]
    """Row of each module's parent; -1 for the root."""
    types: list[int]
    """Index into ``type_names``."""
    type_names: list[str]
    params: list[int]
    bytes: list[int]


class Unit(msgspec.Struct, kw_only=True, omit_defaults=True):
    """One unit of sharding: an FSDP unit, a ZeRO partition, a DDP replica."""

    module: int
    """Tree row of the module the unit is rooted at."""
    kind: str
    """fsdp1, fsdp2, zero3, zero-optimizer, ddp."""
    numel: int
    """Unsharded number of elements the unit manages."""
    local_numel: int
    """Elements this rank stores for the unit, padding included."""
    padding: int = 0
    strategy: str = ""
    offload: bool = False
    dtype: str = ""
    params: int = 0
    """How many original parameters the unit manages."""
    frozen: int = 0
    """Unsharded elements of the unit's parameters that do not require a gradient."""
    grad_numel: int | None = None
    """Elements of the gradient this rank holds for the unit (FSDP1: its flat gradient, frozen
    elements included); None when the unit had no gradient at the snapshot."""
    root: bool | None = None
    """FSDP2: the unit is a root (it never reshards after forward by default); None where not known."""


class Shards(Event, tag="shards"):
    """How this rank holds the model: arrays aligned with ``Tree`` rows."""

    tree_id: int
    engine: str
    stage: str
    """``setup`` before the engine wrapped the model, ``engine`` after, ``step`` later."""
    devices: list[str]
    states: list[str]
    bytes: list[int]
    """Bytes of each module's own parameters stored on this rank (padding excluded)."""
    device: list[int]
    """Index into ``devices``; -1 where the module has no parameters."""
    state: list[int]
    """Index into ``states``: sharded, replicated, unsharded (whole, managed by no engine),
    offloaded (held on CPU/NVMe by an offload policy), persistent (kept whole on every rank by
    ZeRO-3's persistence threshold), gathered (whole now, gathered by the engine for compute and
    released later) or meta; -1 without parameters."""
    unit: list[int]
    """Index into ``units`` of the innermost unit rooted at the module or an ancestor; -1 outside every unit."""
    units: list[Unit] = []
    grad_bytes: list[int] | None = None
    optim_bytes: list[int] | None = None
    info: dict[str, Scalar] = {}
    """Engine-wide facts: sharding strategy, mesh shape, data-parallel size, precision..."""


class GpuMemory(msgspec.Struct, kw_only=True, omit_defaults=True):
    """One GPU as NVML saw it."""

    index: int
    name: str = ""
    uuid: str = ""
    used: int = 0
    total: int = 0
    util: int | None = None
    temperature: int | None = None
    power_w: float | None = None
    pids: list[int] = []


class Memory(Event, tag="memory"):
    """A memory sample of this rank (and, from each node's local rank 0, its GPUs)."""

    device: str = "cpu"
    allocated: int | None = None
    reserved: int | None = None
    peak: int | None = None
    limit: int | None = None
    """The per-process cap the run was given, if any."""
    host_rss: int = 0
    gpus: list[GpuMemory] | None = None


class Phase(Event, tag="phase"):
    """The rank entered a phase: setup, forward, backward, optimizer, validation, teardown."""

    phase: str
    step: int = 0


class Step(Event, tag="step"):
    """A training step finished."""

    step: int
    loss: float | None = None
    seconds: float | None = None


class Oom(Event, tag="oom"):
    """The rank ran out of memory, written and flushed before the error goes on."""

    phase: str
    step: int = 0
    module: str | None = None
    """Path of the module that triggered it (a tree path), if one could be named."""
    module_type: str | None = None
    attributed_by: str = "phase"
    """forward-frame, apply-frame, tracker, engine-step or phase: how ``module`` was found;
    init-frame: only ``module_type`` is known, a module being constructed under ``deepspeed.zero.Init``."""
    engine_step: str | None = None
    """The engine method that was running, e.g. ``DeepSpeedEngine._configure_distributed_model``."""
    module_stack: list[str] = []
    """Module paths from outermost to innermost seen on the stack."""
    requested_bytes: int | None = None
    device: str = "cpu"
    allocated: int | None = None
    reserved: int | None = None
    limit: int | None = None
    total: int | None = None
    gpus: list[GpuMemory] | None = None
    message: str = ""
    traceback: list[str] = []


ATTRIBUTED_BY_WORDS: dict[str, str] = {
    "forward-frame": "named by the forward() frame on the stack",
    "apply-frame": "named by a conversion of its parameters (Module._apply, or an engine looping over them)",
    "init-frame": "the type of the module being built under deepspeed.zero.Init (it had no path yet)",
    "tracker": "named by the module tracker (the module backward was in)",
    "engine-step": "only the engine step is known",
    "phase": "only the phase is known",
}
"""``Oom.attributed_by`` in words, for every screen and report that says how the culprit was found."""


class Exit(Event, tag="exit"):
    """The rank is leaving."""

    code: int
    status: str
    """ok, error, oom or interrupted."""
    error: str | None = None


AnyEvent = Union[Hello, Tree, Shards, Memory, Phase, Step, Oom, Exit]
EVENT_TYPES: tuple[type[Event], ...] = (Hello, Tree, Shards, Memory, Phase, Step, Oom, Exit)
KNOWN_KINDS = frozenset(t.__struct_config__.tag for t in EVENT_TYPES)

_encoder = msgspec.json.Encoder()
_decoder = msgspec.json.Decoder(AnyEvent)
_header = msgspec.json.Decoder(dict)


def encode(event: Event) -> bytes:
    """One event as one JSON line (with its newline)."""
    return _encoder.encode(event) + b"\n"


class SkipReason:
    BAD = "bad"
    """Not JSON, or a known kind with fields of the wrong shape."""
    UNKNOWN = "unknown"
    """A kind this reader does not know."""
    NEWER = "newer"
    """Written by a newer schema version."""


def decode(line: bytes) -> AnyEvent | str:
    """An event, or the reason (a ``SkipReason``) the line was skipped."""
    try:
        event = _decoder.decode(line)
    except msgspec.DecodeError:
        pass
    else:
        return SkipReason.NEWER if event.v > SCHEMA_VERSION else event
    try:
        header = _header.decode(line)
    except msgspec.DecodeError:
        return SkipReason.BAD
    version = header.get("v", SCHEMA_VERSION)
    if isinstance(version, int) and version > SCHEMA_VERSION:
        return SkipReason.NEWER
    if header.get("kind") not in KNOWN_KINDS:
        return SkipReason.UNKNOWN
    return SkipReason.BAD


def event_file(events_dir: Path, rank: int) -> Path:
    return events_dir / f"{EVENT_FILE_PREFIX}{rank}{EVENT_FILE_SUFFIX}"


class EventWriter:
    """Appends one rank's events to its file: flushed per event, fsynced on oom and exit.

    Thread-safe: the memory sampler writes from its own thread.
    """

    def __init__(self, path: Path, rank: int, host: str | None = None) -> None:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        self.path = path
        self.rank = rank
        self.host = host or socket.gethostname()
        self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        self._lock = threading.Lock()

    def write(self, event: Event) -> None:
        event.rank = self.rank
        event.host = self.host
        event.t = time.time()
        line = encode(event)
        with self._lock:
            if self._fd < 0:
                return
            os.write(self._fd, line)
            if isinstance(event, (Oom, Exit)):
                os.fsync(self._fd)

    def close(self) -> None:
        with self._lock:
            if self._fd >= 0:
                os.close(self._fd)
                self._fd = -1


@dataclass
class _Tail:
    offset: int = 0
    pending: bytes = b""


@dataclass
class EventReader:
    """Follows every rank's event file in a directory, returning only new events.

    A line without its newline yet is held back until it is complete; call
    ``finish()`` once the writers are gone to count such a torn last line.
    """

    events_dir: Path
    skipped: dict[str, int] = field(default_factory=lambda: {"bad": 0, "unknown": 0, "newer": 0, "torn": 0})
    _tails: dict[Path, _Tail] = field(default_factory=dict)

    def files(self) -> list[Path]:
        if not self.events_dir.is_dir():
            return []
        return sorted(self.events_dir.glob(f"{EVENT_FILE_PREFIX}*{EVENT_FILE_SUFFIX}"))

    def read_new(self) -> list[AnyEvent]:
        """Every event appended since the last call, file by file."""
        events: list[AnyEvent] = []
        for path in self.files():
            events.extend(self._read_file(path))
        return events

    def _read_file(self, path: Path) -> Iterator[AnyEvent]:
        tail = self._tails.setdefault(path, _Tail())
        try:
            with open(path, "rb") as f:
                f.seek(tail.offset)
                chunk = f.read()
        except OSError:
            return
        if not chunk:
            return
        tail.offset += len(chunk)
        data = tail.pending + chunk
        *lines, tail.pending = data.split(b"\n")
        for line in lines:
            if not line.strip():
                continue
            result = decode(line)
            if isinstance(result, str):
                self.skipped[result] += 1
            else:
                yield result

    def finish(self) -> None:
        """Count lines left without a newline (a writer died mid-line) as torn."""
        for tail in self._tails.values():
            if tail.pending.strip():
                self.skipped["torn"] += 1
                tail.pending = b""

    @property
    def skipped_total(self) -> int:
        return sum(self.skipped.values())


def read_all(events_dir: Path) -> tuple[list[AnyEvent], dict[str, int]]:
    """Every event of a finished (or live) run at once, with the skip counts."""
    reader = EventReader(events_dir)
    events = reader.read_new()
    reader.finish()
    return events, dict(reader.skipped)


def tree_paths(names: Iterable[str], parents: Iterable[int]) -> list[str]:
    """Full dotted paths of the rows of a ``Tree`` (the root is ``""``)."""
    paths: list[str] = []
    for name, parent in zip(names, parents):
        if parent < 0:
            paths.append(name)
        else:
            base = paths[parent]
            paths.append(f"{base}.{name}" if base else name)
    return paths
