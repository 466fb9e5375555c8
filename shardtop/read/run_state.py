"""A run's events as one immutable snapshot: the ground the read model stands on.

``RunState`` is everything a run's events said at one moment, ``RankState``
what one rank said, ``Holdings`` what a rank's shards snapshot stores, summed
once when it arrives (``holdings_of``).  ``run_fold`` builds these snapshots
from the events; the read model (``run_model.py``) answers the questions the
views ask of them.  Pure Python: no torch, no textual.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from itertools import compress
from types import MappingProxyType

from shardtop.read.memory_growth import StepMemory
from shardtop.rundir.events import (
    Exit,
    Fault,
    Hello,
    Kept,
    Memory,
    Oom,
    PhaseName,
    Planned,
    Shards,
    Snapshot,
    Step,
    Tree,
)
from shardtop.rundir.memory_figures import GpuMemory, MemorySplit

TRAINING_PHASES: frozenset[PhaseName] = frozenset({"forward", "backward", "optimizer"})
"""Phases in which every rank runs the same code: samples taken in them can be compared rank to rank."""

STORED_NOWHERE = frozenset({"meta"})
"""Devices that store nothing (deferred initialisation)."""


OFFLOADED = "offloaded"
"""The state (``Shards.states``) of parameters an engine's offload policy holds in host memory or on NVMe."""


@dataclass(frozen=True, slots=True)
class Offloaded:
    """What an engine's offload policy holds for a rank in host memory (or on NVMe), off the rank's device:
    parameters held ``offloaded``, and the gradients and optimizer state the engine says it offloads
    (``Shards.offloaded_grad_bytes``/``offloaded_optim_bytes``).  On a CPU process that is the same memory
    as the rest; it is still what the engine moved off the device it computes on."""

    params: int = 0
    grads: int = 0
    optimizer: int = 0

    @property
    def total(self) -> int:
        return self.params + self.grads + self.optimizer


NOTHING_OFFLOADED = Offloaded()


def offloaded_params(shards: Shards) -> list[int]:
    """Each row's parameter bytes held ``offloaded`` (0 for the others)."""
    state = shards.states.index(OFFLOADED) if OFFLOADED in shards.states else -2
    return [size if s == state else 0 for size, s in zip(shards.bytes, shards.state, strict=True)]


def offloaded_of(shards: Shards) -> Offloaded:
    grads, optimizer = shards.offloaded_grad_bytes, shards.offloaded_optim_bytes
    params = sum(offloaded_params(shards)) if OFFLOADED in shards.states else 0
    if not params and grads is None and optimizer is None:
        return NOTHING_OFFLOADED
    return Offloaded(params=params, grads=sum(grads or ()), optimizer=sum(optimizer or ()))


@dataclass(frozen=True)
class Holdings:
    """What one shards snapshot says its rank stores: parameter bytes per device, gradients, optimizer state
    (each wherever it is held), and how much of them is offloaded to host memory."""

    by_device: Mapping[str, int]
    """Stored parameter bytes per device (meta excluded)."""
    grad_bytes: int | None
    optim_bytes: int | None
    offloaded: Offloaded = NOTHING_OFFLOADED
    """Of the above, what the engine's offload policy holds in host memory, off the rank's device."""

    @property
    def param_bytes(self) -> int:
        return sum(self.by_device.values())


def holdings_of(shards: Shards) -> Holdings:
    """Summed over the tree once per snapshot: views ask every refresh, for every rank.

    One pass in C per device the rows name (a few), not a Python loop over the
    rows; the devices come in the order of their first row that holds bytes.
    """
    names, device, sizes = shards.devices, shards.device, shards.bytes
    held: list[tuple[int, str, int]] = []
    for d in set(device):
        if 0 <= d < len(names) and names[d] not in STORED_NOWHERE:
            on_d = list(map(d.__eq__, device))
            first = next((row for row in compress(range(len(on_d)), on_d) if sizes[row]), None)
            if first is not None:
                held.append((first, names[d], sum(compress(sizes, on_d))))
    by_device: dict[str, int] = {}
    for _, name, total in sorted(held):
        by_device[name] = by_device.get(name, 0) + total
    return Holdings(
        by_device=MappingProxyType(by_device),
        grad_bytes=None if shards.grad_bytes is None else sum(shards.grad_bytes),
        optim_bytes=None if shards.optim_bytes is None else sum(shards.optim_bytes),
        offloaded=offloaded_of(shards),
    )


@dataclass(frozen=True, slots=True)
class PhaseSample:
    """A rank's latest memory sample taken in one step and phase."""

    step: int
    phase: str
    memory: Memory


@dataclass(frozen=True, slots=True)
class GpuSample:
    """One NVML reading of a host's GPUs, with when and in which phase the sampling rank took it."""

    t: float
    rank: int
    step: int
    phase: str
    gpus: tuple[GpuMemory, ...]


@dataclass(frozen=True, slots=True)
class RankState:
    """What one rank has said so far."""

    rank: int
    host: str = ""
    """The host it runs on, as its hello says."""
    hello: Hello | None = None
    """How it came up: its process, device and engine (None until it says hello)."""
    phase: str = ""
    """The phase it is in now (an OOM's, once it ran out)."""
    step: int = 0
    """The highest step it has entered a phase of or finished."""
    last_step: Step | None = None
    """The last step it finished, with its loss and time."""
    memory: Memory | None = None
    """Its latest memory sample."""
    peak_memory: Memory | None = None
    """The sample with the highest allocator peak (or allocation) so far."""
    allocated_history: tuple[int, ...] = ()
    peak_host_rss: int = 0
    """The highest resident host memory of the rank's process in any sample."""
    split: MemorySplit | None = None
    """The latest split of the rank's memory by kind (samples taken at a phase change carry one)."""
    peak_split: MemorySplit | None = None
    """The latest split at the rank's peak so far (the probe writes it when it changes)."""
    process_sample: Memory | None = None
    """The latest sample with NVML's count of the process's device memory (not every sample has one)."""
    phase_samples: tuple[PhaseSample, ...] = ()
    """The latest sample of each recent (step, phase) in a training phase, oldest first."""
    step_memory: tuple[StepMemory, ...] = ()
    """Memory at the start of each step's forward, oldest first (thinned past ``run_fold.STEP_MEMORY_KEPT``)."""
    kept: Kept | None = None
    """The latest trace of tensors kept across steps."""
    snapshots: tuple[Snapshot, ...] = ()
    """The allocator's memory snapshots the rank wrote (CUDA), the latest of each moment."""
    progress_t: float | None = None
    """When the rank last entered a phase or finished a step."""
    step_seconds: tuple[float, ...] = ()
    """How long its recent steps took, oldest first."""
    shards: Shards | None = None
    """The latest shards for the current tree."""
    holdings: Holdings | None = None
    """What ``shards`` hold, summed."""
    setup_shards: Shards | None = None
    """How the rank held the model before the engine wrapped it (stage ``setup``)."""
    setup_holdings: Holdings | None = None
    """What ``setup_shards`` hold, summed."""
    engine_wrapped: bool = False
    """A snapshot was taken after the engine wrapped the model (a set-up OOM's snapshot is not one):
    ``shards`` then say how the engine holds it, else how set-up left it."""
    oom: Oom | None = None
    exit: Exit | None = None
    faults: tuple[Fault, ...] = ()
    """Parts of the probe that failed on this rank and were switched off (training went on)."""

    @property
    def device(self) -> str:
        if self.hello is not None:
            return self.hello.device
        return self.memory.device if self.memory else ""

    @property
    def pid(self) -> int | None:
        return self.hello.pid if self.hello else None

    @property
    def left_at(self) -> float | None:
        """When the rank stopped running its training: exit, OOM or teardown, whichever came first."""
        times = [e.t for e in (self.exit, self.oom) if e is not None]
        return min(times) if times else None


@dataclass(frozen=True)
class RunState:
    """Everything a run's events said, at one moment."""

    tree: Tree | None = None
    paths: tuple[str, ...] = ()
    ranks: Mapping[int, RankState] = field(default_factory=lambda: MappingProxyType({}))
    gpus: Mapping[str, tuple[GpuMemory, ...]] = field(default_factory=lambda: MappingProxyType({}))
    """The latest NVML sample of each host's GPUs."""
    gpu_samples: Mapping[str, tuple[GpuSample, ...]] = field(default_factory=lambda: MappingProxyType({}))
    """Recent NVML samples of each host taken during training (see ``TRAINING_PHASES``)."""
    skipped_by: Mapping[str, int] = field(default_factory=lambda: MappingProxyType({}))
    """Lines of the event files that could not be read, by reason: bad, unknown, newer, torn."""
    inconsistent: int = 0
    """Events that were well-formed but contradicted themselves or the tree, and were left out."""
    plan: Planned | None = None
    """The plan of the strategy the run runs, as the rank that made it at set-up wrote it (the latest)."""
    events: int = 0
    first_t: float | None = None
    last_t: float | None = None

    @property
    def skipped(self) -> int:
        return sum(self.skipped_by.values())

    def rank_list(self) -> list[RankState]:
        """The ranks in rank order."""
        return [self.ranks[r] for r in sorted(self.ranks)]
