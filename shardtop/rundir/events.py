"""The event contract between training ranks and everything that reads a run.

Ranks append one JSON object per line to ``events/rank-<N>.jsonl`` in the run
directory; the TUI, ``shardtop report`` and ``shardtop runs`` read them back.
These modules are the only ones both sides import, so they import neither torch
nor textual.

Every event carries the schema version ``v``, the ``rank``, the ``host`` and a
wall-clock timestamp ``t``.  Readers skip (and count) lines they cannot parse,
kinds they do not know and versions newer than theirs: a torn last line or a
newer writer never crashes a reader.

The module tree is written once per structure (``Tree``), column-wise, so a
100 000-module model stays small; per-rank arrays in ``Shards`` are aligned
with the tree's rows by index and name the tree they belong to (``tree_id``).

A ``Fault`` says that part of the probe failed inside a rank and was switched
off while training went on: ``part`` names which (``FAULT_PARTS``), ``error``
what went wrong, so a reader can say "the probe's shard reader failed on
rank 1: ...".  Readers older than it skip it as an unknown kind.

The memory figures the events carry are in ``memory_figures.py``; one event as
one line and back, in ``event_lines.py``; writing and reading the files, in
``event_files.py``.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Literal

import msgspec

from shardtop.rundir.memory_figures import AllocatorStats, GpuMemory, MemorySplit

SCHEMA_VERSION = 1
"""Bumped when a field changes meaning; new optional fields do not bump it."""

EVENT_FILE_PREFIX = "rank-"
EVENT_FILE_SUFFIX = ".jsonl"
MEMORY_REQUEST_FILE = "requests/explain-memory"
"""Created in the run directory by a reader to ask every rank to explain its next steps' memory
(saved activations per module, a census at each phase, the CUDA allocator's trace); each rank
removes it when it sees it, within a memory sample."""

Scalar = str | int | float | bool | None

# The words some fields hold, as the code that writes and reads them knows them.  The fields
# themselves stay ``str``: a reader must keep an event whose word an older or newer writer (or a
# user, through ``shardtop.probe.phase(name)``) chose.

PhaseName = Literal["setup", "forward", "backward", "optimizer", "validation", "teardown"]
"""The phases the probe's drivers enter (``Phase.phase``, ``Oom.phase``, ``MemorySplit.phase``)."""

SnapshotStage = Literal["setup", "engine", "step", "oom"]
"""When a rank's ``Shards`` were read (``Shards.stage``)."""

AttributedBy = Literal["forward-frame", "apply-frame", "init-frame", "build-frame", "tracker", "engine-step", "phase"]
"""How an OOM's culprit was found (``Oom.attributed_by``; in words: ``ATTRIBUTED_BY_WORDS``)."""

ExitStatus = Literal["ok", "error", "oom", "interrupted"]
"""How a rank ended, in its own words (``Exit.status``)."""


class Event(msgspec.Struct, tag_field="kind", kw_only=True, frozen=True):
    """Fields every event carries.

    Frozen, like every struct in an event: what a rank wrote is what every view reads, and no
    reader can change it for the others.  Build a changed copy with ``msgspec.structs.replace``.
    """

    v: int = SCHEMA_VERSION
    rank: int = 0
    host: str = ""
    t: float = 0.0


class Hello(Event, tag="hello", frozen=True):
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
    asked_engine: str = ""
    """The engine the launcher's configuration asked for, as the environment it set says (accelerate's
    ``ACCELERATE_USE_FSDP`` and ``FSDP_VERSION``, ``ACCELERATE_USE_DEEPSPEED``): fsdp1, fsdp2, zero1-3
    or deepspeed; "" where none says."""


class Tree(Event, tag="tree", frozen=True):
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


class Unit(msgspec.Struct, kw_only=True, omit_defaults=True, frozen=True):
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
    also: list[int] = []
    """Tree rows of the other modules the unit was made of (FSDP2's ``fully_shard([norm, lm_head])``)."""


class Shards(Event, tag="shards", frozen=True):
    """How this rank holds the model: arrays aligned with ``Tree`` rows."""

    tree_id: int
    engine: str
    stage: str
    """A ``SnapshotStage``: ``setup`` before the engine wrapped the model (after ``configure_model``
    too), ``engine`` after, ``step`` later, ``oom`` as the model was held when this rank ran out of
    memory (a set-up move shows which modules had reached the device)."""
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
    """Bytes of each module's own gradients on this rank: ``param.grad``, FSDP's sharded gradients,
    ZeRO-1/2 gradient partitions, ZeRO-3's partitioned gradient buffer; None when no source holds any.
    At stage ``step``: as held just before the first optimizer step, when the probe saw that moment
    (ZeRO-1/2 free their partitions inside the step, a loop may zero them after it)."""
    optim_bytes: list[int] | None = None
    """Bytes of each module's optimizer state this rank holds (fp32 master copies included), wherever held."""
    offloaded_grad_bytes: list[int] | None = None
    """Of ``grad_bytes``, what the engine's offload policy holds in host memory (or on NVMe), not on the
    rank's device: ZeRO's gradient partitions under ``offload_optimizer``, FSDP's gradients of offloaded
    parameters.  Decided from the engine's settings, so a CPU process says it too.  None where nothing is
    offloaded (and in recordings older than this field)."""
    offloaded_optim_bytes: list[int] | None = None
    """Of ``optim_bytes``, what the engine's offload policy holds in host memory (or on NVMe), as
    ``offloaded_grad_bytes``: ZeRO's ``offload_optimizer``, the state of FSDP's offloaded parameters."""
    act_bytes: list[int] | None = None
    """Bytes each module's own forward saved for backward (its children's not included; parameters
    not counted), measured in the probe's first explained steps; None before a forward was explained."""
    info: dict[str, Scalar] = {}
    """Engine-wide facts: sharding strategy, mesh shape, data-parallel size, precision..."""


class Memory(Event, tag="memory", frozen=True):
    """A memory sample of this rank (and, from each node's local rank 0, its GPUs)."""

    device: str = "cpu"
    allocated: int | None = None
    reserved: int | None = None
    peak: int | None = None
    limit: int | None = None
    """The per-process cap the run was given, if any."""
    host_rss: int = 0
    host_heap: int | None = None
    """On CPU: the bytes the process's C allocator has in use (glibc ``mallinfo2``), CPU tensors
    included; what a CPU rank's memory is compared by from step to step (RSS moves in steps)."""
    gpus: list[GpuMemory] | None = None
    split: MemorySplit | None = None
    """What fills ``allocated`` now (on CPU, the kinds alone), with the phase and step it was taken
    at.  Only samples taken at a phase change or a step's end carry one (the census runs on the
    training thread, as often as its time budget allows; at every phase of an explained step);
    None on the others, the background thread's included."""
    peak_split: MemorySplit | None = None
    """The split at this rank's peak so far: from the allocator's trace where one was recorded
    (CUDA), else the split sample with the highest ``allocated``.  Compare its ``allocated`` with
    ``peak`` to see how close to the true peak it is.  Written when it changes; the latest holds."""
    allocator: AllocatorStats | None = None
    """The allocator's key numbers (CUDA only)."""
    process_used: int | None = None
    """Device memory NVML counts for this process (CUDA context, cuBLAS/NCCL workspaces and the
    allocator's reserved memory); ``process_used - reserved`` is memory outside PyTorch's allocator."""


class Phase(Event, tag="phase", frozen=True):
    """The rank entered a phase: a ``PhaseName`` (setup, forward, backward, optimizer, validation,
    teardown), or one the user named."""

    phase: str
    step: int = 0


class Step(Event, tag="step", frozen=True):
    """A training step finished."""

    step: int
    loss: float | None = None
    seconds: float | None = None


class StackTensor(msgspec.Struct, kw_only=True, omit_defaults=True, frozen=True):
    """A large tensor a frame of the failing stack held at an OOM: what the failing code was working on."""

    name: str
    """The local variable (``logits``); ``outputs[3]`` for an item of a list or tuple."""
    shape: list[int]
    dtype: str
    nbytes: int
    where: str
    """``function (file.py:line)`` of the frame."""
    depth: int | None = None
    """How far the frame is from the one the error was raised in: 0 that frame, 1 its caller; None where
    not recorded."""


class Oom(Event, tag="oom", frozen=True):
    """The rank ran out of memory, written and flushed before the error goes on."""

    phase: str
    step: int = 0
    module: str | None = None
    """Path of the module that triggered it (a tree path), if one could be named."""
    module_type: str | None = None
    attributed_by: str = "phase"
    """An ``AttributedBy``: forward-frame, apply-frame, tracker, engine-step or phase: how ``module`` was
    found; init-frame: only ``module_type`` is known, a module being constructed under ``deepspeed.zero.Init``;
    build-frame: a module being constructed (its ``__init__`` on the stack), named where it was already
    attached to the model being built."""
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
    peak: int | None = None
    """``torch.cuda.max_memory_allocated()`` read at the OOM: the true peak, which samples miss."""
    allocator: AllocatorStats | None = None
    """The allocator's key numbers at the OOM (CUDA only)."""
    memory: MemorySplit | None = None
    """What filled allocated memory at the OOM, by kind (on CPU, the kinds alone)."""
    kept_graph_bytes: int | None = None
    """Of ``memory``'s kept tensors, the bytes held by the autograd graphs of earlier forwards: tensors saved
    for a backward that never ran, alive because outputs of those forwards were kept (None: not read)."""
    kept_by: str = ""
    """What holds kept outputs of earlier forwards on the failing stack, in words: ``outputs`` in
    ``evaluate`` (eval.py:41), 15 tensors, 1.2 GiB; "" where none does."""
    stack_tensors: list[StackTensor] = []
    """The largest tensors the failing stack's frames held (at most ``MAX_STACK_TENSORS``), largest first."""
    peak_split: MemorySplit | None = None
    """What filled it at the rank's peak (``peak``), from the allocator's trace, where one was
    recording: a set-up OOM often comes after a higher, passing peak."""


ATTRIBUTED_BY_WORDS: dict[AttributedBy, str] = {
    "forward-frame": "named by the forward() frame on the stack",
    "apply-frame": "named by a conversion of its parameters (Module._apply, or an engine looping over them)",
    "init-frame": "the type of the module being built under deepspeed.zero.Init (it had no path yet)",
    "build-frame": "the module being built, by its __init__ on the stack",
    "tracker": "named by the module tracker (the module whose tensors the failing operation was working on)",
    "engine-step": "only the engine step is known",
    "phase": "only the phase is known",
}
"""``Oom.attributed_by`` in words, for every screen and report that says how the culprit was found."""


class Fault(Event, tag="fault", frozen=True):
    """Part of the probe failed on this rank and was switched off; training went on."""

    part: str
    """Which part (a key of ``FAULT_PARTS``)."""
    error: str
    """What went wrong, e.g. ``RuntimeError: ...`` or ``No space left on device``."""


FAULT_PARTS: dict[str, str] = {
    "events": "event file",
    "shards": "shard reader",
    "memory": "memory sampler",
    "names": "module naming",
    "oom": "OOM attribution",
    "steps": "step recorder",
    "run": "run directory",
    "split": "memory split",
    "snapshots": "memory snapshot writer",
}
"""``Fault.part`` in words: "the probe's {words} failed on rank N"."""


class Exit(Event, tag="exit", frozen=True):
    """The rank is leaving."""

    code: int
    status: ExitStatus
    """ok, error, oom or interrupted."""
    error: str | None = None
    signal: int | None = None
    """The signal that ended the rank (SIGTERM, SIGINT, SIGHUP) when ``status`` is interrupted."""


TIMELINE = ("set-up", "forward", "backward", "optimizer step", "next forward", "next backward")
"""The phases of a plan's ``timeline`` (``PlannedRank.timeline``), in the order a run meets them."""
_IN_WORDS = {
    "set-up": "at set-up",
    "forward": "in the first forward pass",
    "backward": "in the first backward pass",
    "optimizer step": "at the first optimizer step",
    "next forward": "in the second step's forward pass",
    "next backward": "in the second step's backward pass",
}


def when(phase: str) -> str:
    """``at set-up``, ``in the first backward pass``...: a phase of ``TIMELINE`` in a sentence."""
    return _IN_WORDS.get(phase, f"at {phase}")


HELD_KINDS = ("params", "grads", "optimizer", "activations", "gathered", "buffers")
"""What a plan says a rank holds, kind by kind: the figures of those names of ``PlannedRank`` (and of the
plan's ``PerRank``), in the order the plan's and the report's JSON give them."""


class PlannedRank(msgspec.Struct, kw_only=True, omit_defaults=True, frozen=True):
    """What ``shardtop plan`` predicts one rank holds on its device, in bytes (``plan.memory.PerRank``)."""

    params: int
    grads: int
    optimizer: int
    activations: int
    gathered: int = 0
    buffers: int = 0
    conv_workspace: int = 0
    """cuDNN's convolution workspace in backward, for the shapes measured (``plan/workspaces.py``)."""
    peak: int
    peak_phase: str
    timeline: list[int] = []
    """Peaks in the order a run meets them: set-up, forward, backward, optimizer step (the first),
    next forward, next backward (``TIMELINE``)."""


class Planned(Event, tag="plan", frozen=True):
    """The plan of the strategy this run really runs, written once at set-up by the rank that knows it.

    The report and the run view set it against what the ranks measured; every
    rank of the run is planned alike, so one ``per_rank`` stands for each.
    """

    strategy: str
    """The strategy in the plan's words, e.g. ``ZeRO-3, fp32, model built whole first``."""
    engine: str
    model: str
    params: int
    batch_size: int
    devices: int
    accelerator: str
    per_rank: PlannedRank
    gpu: str = ""
    """The GPU the plan was judged against ("" when none: a CPU run without a limit)."""
    usable: int | None = None
    """What a rank's peak may reach on that GPU."""
    fits: bool | None = None
    runs_out_at: str | None = None
    made_by: str = ""
    """Who planned it: ``preset`` (the runner's rank 0) or ``shardtop run`` (the injected rank)."""
    notes: list[str] = []
    """What the plan could not see, in words (e.g. activations measured on one module only)."""


class KeptTensor(msgspec.Struct, kw_only=True, omit_defaults=True, frozen=True):
    """Tensors of one shape and dtype that one module's forward made and that outlived their step."""

    module: str
    """Tree path of the innermost module whose forward returned them ("" for the root)."""
    module_type: str = ""
    shape: list[int] = []
    dtype: str = ""
    bytes: int = 0
    """Their storages' bytes, each storage once."""
    count: int = 1


class Kept(Event, tag="kept", frozen=True):
    """What one traced step's forward made that was still alive when the next step's forward began:
    tensors kept across steps (a list of outputs, a hook that stores activations), by module."""

    step: int
    """The step traced."""
    tensors: list[KeptTensor] = []
    bytes: int = 0
    """All of them, each storage once."""


SnapshotMoment = Literal["oom", "peak"]
"""When a rank wrote its allocator's snapshot: at its OOM, or after the steps it explained (their peak)."""


class Snapshot(Event, tag="snapshot", frozen=True):
    """A rank wrote its CUDA allocator's memory snapshot, in PyTorch's own pickle format, for
    ``torch.cuda._memory_viz`` and pytorch.org/memory_viz."""

    moment: SnapshotMoment
    file: str
    """The file's path in the run directory: ``snapshots/rank-R-MOMENT.pickle``."""
    bytes: int
    cut: bool = False
    """The allocation trace was left out to keep the file under its bound (the segments stay)."""
    entries: int = 0
    """Allocation trace entries the file holds."""


AnyEvent = Hello | Tree | Shards | Memory | Phase | Step | Oom | Fault | Exit | Planned | Kept | Snapshot
EVENT_TYPES: tuple[type[Event], ...] = (
    Hello, Tree, Shards, Memory, Phase, Step, Oom, Fault, Exit, Planned, Kept, Snapshot,
)
LAST_RECORDS: tuple[type[Event], ...] = (Oom, Fault, Exit)
"""Kinds written (and fsynced) even once the disk is full, into the room kept for them."""


def tree_paths(names: Iterable[str], parents: Iterable[int]) -> list[str]:
    """Full dotted paths of the rows of a ``Tree`` (the root is ``""``)."""
    paths: list[str] = []
    for name, parent in zip(names, parents, strict=True):
        if parent < 0:
            paths.append(name)
        else:
            base = paths[parent]
            paths.append(f"{base}.{name}" if base else name)
    return paths
