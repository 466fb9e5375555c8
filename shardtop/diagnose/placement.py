"""Where the bytes ended up: devices, ranks or GPUs very unevenly loaded (story 1: GPU 0 fills,
GPU 1 holds 3 MB), and ranks with a CUDA context on a GPU that is not theirs.

Rank-to-rank comparisons of memory use only samples taken while every rank was alive and in
the same step and phase (``RunModel.comparable_memory``, ``comparable_gpus``): never at
teardown, never after a rank left, never in a rehearsal (its ranks ran one after another on
one device).  A rehearsal's ranks are compared on what they hold (parameter bytes), which does
not depend on when they ran; and no GPU's process list says anything about the GPUs the job's
ranks would use, since every rehearsed rank runs alone on the one device there is.

Parameter bytes are compared only between snapshots of one moment (``_same_moment``): the same
stage read from the same engine, no rank stopped part-way through set-up while the others went
on, and none holding what an engine holds whole for a moment only (parameters gathered for
compute), which hides the share the rank keeps.  A rank that ran out of memory inside
``fully_shard`` held the model as it was before sharding, while its peers, past that call, held
their shards: that is a moment of set-up (``setup_transient.py`` tells it), not two ranks given
unequal shares.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from shardtop.diagnose.facts import OomEvidence, fmt
from shardtop.diagnose.finding import Evidence, Explanation, Rule
from shardtop.read.rank_facts import RankFacts
from shardtop.read.run_model import RunModel
from shardtop.read.tree_facts import covering_rows
from shardtop.rundir.engines import MANUAL
from shardtop.rundir.events import Shards
from shardtop.units import times
from shardtop.words import list_names, module_label

IMBALANCE_RATIO = 2.0
"""Two devices (or ranks) are "very uneven" when one holds at least twice what the other
holds: the fuller one then runs out of memory at half the model size the pair could fit."""

SHARD_IMBALANCE_MIN_BYTES = 8 << 20
"""Parameter bytes that differ by less than 8 MiB are not worth a finding on any GPU."""

MEMORY_IMBALANCE_MIN_BYTES = 1 << 30
"""Allocator and NVML readings include CUDA contexts, caches and workspaces (hundreds of
MiB each): only a gap of 1 GiB or more says something about where the model went."""

TRANSIENT_STATES = frozenset({"gathered"})
"""Held whole only for a moment (gathered for compute, released to a shard later): not a rank's share."""

NO_STORAGE_DEVICES = ("cpu", "meta", "nvme", "disk")
"""Not accelerators: a model split between a GPU and the CPU is offload, not placement."""

_CUDA_INDEX = re.compile(r"^cuda:(\d+)$")


@dataclass(frozen=True)
class Comparison:
    """Two sides of one comparison, heavy first."""

    kind: str
    """devices (one process), ranks (parameters), gpus (NVML) or allocator."""
    heavy: str
    heavy_bytes: int
    light: str
    light_bytes: int
    mean_bytes: int
    rank: int | None = None
    """The rank on the heavy side (ranks, allocator) or holding the heavy device (devices)."""
    device: str | None = None
    """The heavy device, when known."""
    sample: str = ""
    """Which samples were compared: ``step 2, backward``; empty for parameter bytes."""

    @property
    def ratio(self) -> float:
        return self.heavy_bytes / max(self.light_bytes, 1)


@dataclass(frozen=True)
class Imbalance(Evidence):
    main: Comparison
    others: tuple[Comparison, ...]
    modules: tuple[str, ...]
    """The outermost modules behind the heavy side, where the shards tell."""
    oom: OomEvidence | None
    """An OOM on the heavy side."""
    manual: bool
    """The run places modules by hand (engine ``manual``), or one process spreads them over devices."""


def _uneven(values: dict[str, int], min_gap: int) -> tuple[str, int, str, int, int] | None:
    if len(values) < 2:
        return None
    heavy = max(values, key=values.__getitem__)
    light = min(values, key=values.__getitem__)
    hi, lo = values[heavy], values[light]
    if hi - lo < min_gap or hi < IMBALANCE_RATIO * max(lo, 1):
        return None
    return heavy, hi, light, lo, sum(values.values()) // len(values)


def _device_comparisons(m: RunModel) -> list[Comparison]:
    out = []
    for r in m.ranks:
        accel = {d: b for d, b in r.by_device.items() if not d.startswith(NO_STORAGE_DEVICES)}
        found = _uneven(accel, SHARD_IMBALANCE_MIN_BYTES)
        if found:
            heavy, hi, light, lo, mean = found
            out.append(Comparison("devices", heavy, hi, light, lo, mean, rank=r.rank, device=heavy))
    return out


def holds_transient(s: Shards) -> bool:
    """Some of the snapshot's bytes are held whole for a moment only (``TRANSIENT_STATES``)."""
    transient = {i for i, name in enumerate(s.states) if name in TRANSIENT_STATES}
    return any(state in transient and size for size, state in zip(s.bytes, s.state, strict=True))


def _stopped_in_setup(r: RankFacts) -> bool:
    return r.oom is not None and r.oom.phase == "setup"


def _same_moment(pool: list[RankFacts]) -> bool:
    """The ranks' holdings were read at one moment: the same stage, from the same engine, and either every
    rank or none stopped in set-up (a rank cut short there holds the model as it was before the engine
    finished with it, while its peers went on)."""
    moments = {(r.holdings.stage, r.holdings.engine) if r.holdings else ("", "") for r in pool}
    stopped = sum(map(_stopped_in_setup, pool))
    return len(moments) == 1 and stopped in (0, len(pool))


def _settled(pool: list[RankFacts]) -> bool:
    """No rank's holdings include parameters gathered for a moment: a rank's share is not known from
    them (the gathered whole hides the shard it keeps)."""
    return not any(r.holdings is not None and holds_transient(r.holdings) for r in pool)


def _rank_comparison(m: RunModel) -> Comparison | None:
    # like with like: one rank's set-up snapshot (whole) must not be weighed against another's engine one
    pool = [r for r in m.ranks if r.shards is not None] or [r for r in m.ranks if r.setup is not None]
    if not _same_moment(pool) or not _settled(pool) or len(pool) < max(len(m.expected_ranks), 2):
        return None  # a rehearsal's ranks are all it has: each holds what it would in the job
    found = _uneven({f"rank {r.rank}": r.param_bytes for r in pool}, SHARD_IMBALANCE_MIN_BYTES)
    if not found:
        return None
    heavy, hi, light, lo, mean = found
    rank = int(heavy.split()[1])
    return Comparison("ranks", heavy, hi, light, lo, mean, rank=rank, device=_rank(m, rank).device)


def _allocator_comparison(m: RunModel) -> Comparison | None:
    same = m.comparable_memory
    if same is None:
        return None
    peaks = {
        f"rank {rank}": max(v for v in (mem.allocated, mem.peak, 0) if v is not None)
        for rank, mem in same.samples.items()
        if mem.device.startswith("cuda")
    }
    found = _uneven(peaks, MEMORY_IMBALANCE_MIN_BYTES)
    if not found:
        return None
    heavy, hi, light, lo, mean = found
    rank = int(heavy.split()[1])
    return Comparison(
        "allocator", heavy, hi, light, lo, mean, rank=rank, device=_rank(m, rank).device,
        sample=f"step {same.step}, {same.phase}",
    )


def _gpu_comparisons(m: RunModel) -> list[Comparison]:
    out = []
    for host in m.hosts:
        sample = m.comparable_gpus(host)
        if sample is None:
            continue
        on_host = [r for r in m.ranks if r.host == host]
        assigned = {int(x.group(1)) for r in on_host if (x := _CUDA_INDEX.match(r.device))}
        pids = {r.pid for r in on_host if r.pid}
        mine = [g for g in sample.gpus if g.index in assigned or pids.intersection(g.pids)]
        label = f" on {host}" if len(m.hosts) > 1 else ""
        found = _uneven({f"GPU {g.index}{label}": g.used for g in mine}, MEMORY_IMBALANCE_MIN_BYTES)
        if found:
            heavy, hi, light, lo, mean = found
            index = int(heavy.split()[1])
            out.append(
                Comparison("gpus", heavy, hi, light, lo, mean, device=f"cuda:{index}",
                           sample=f"step {sample.step}, {sample.phase}")
            )
    return out


def _rank(m: RunModel, rank: int) -> RankFacts:
    found = m.rank(rank)
    assert found is not None
    return found


def _modules_on(m: RunModel, c: Comparison) -> tuple[str, ...]:
    tree = m.tree
    if tree is None or c.rank is None:
        return ()
    heavy = _rank(m, c.rank).holdings
    if heavy is None or not m.aligned(heavy):
        return ()
    if c.kind == "devices":
        selected = [0 <= d < len(heavy.devices) and heavy.devices[d] == c.heavy for d in heavy.device]
    elif c.kind == "ranks":
        light = _rank(m, int(c.light.split()[1])).holdings
        if light is None or not m.aligned(light):
            return ()
        selected = [a > b for a, b in zip(heavy.bytes, light.bytes, strict=True)]
    else:
        return ()
    return tuple(m.path(row) for row in covering_rows(selected, [b > 0 for b in tree.bytes], tree.parents))


def _oom_on(m: RunModel, c: Comparison) -> OomEvidence | None:
    for story in m.ooms:
        o = story.oom
        if (
            (c.rank is not None and c.kind != "devices" and o.rank == c.rank)
            or (c.device is not None and o.device == c.device)
        ):
            return OomEvidence.of(story, len(m.ooms))
    return None


def find_imbalance(m: RunModel) -> Imbalance | None:
    found = [
        *_device_comparisons(m),
        *filter(None, [_rank_comparison(m)]),
        *_gpu_comparisons(m),
        *filter(None, [_allocator_comparison(m)]),
    ]
    if not found:
        return None
    main = max(found, key=lambda c: (_oom_on(m, c) is not None, c.heavy_bytes - c.light_bytes))
    return Imbalance(
        main=main,
        others=tuple(c for c in found if c is not main),
        modules=_modules_on(m, main),
        oom=_oom_on(m, main),
        manual=main.kind == "devices" or m.engine == MANUAL,
    )


KIND_TITLES = {
    "devices": "parameters per device",
    "ranks": "parameters per rank",
    "gpus": "GPU memory in use",
    "allocator": "allocator memory",
}

KIND_WORDS = {
    "devices": "parameter bytes per device within rank {rank}",
    "ranks": "parameter bytes per rank",
    "gpus": "GPU memory in use (NVML, {sample}, every rank alive)",
    "allocator": "allocated memory per rank ({sample}, every rank alive)",
}


def _line(c: Comparison) -> str:
    what = KIND_WORDS[c.kind].format(rank=c.rank, sample=c.sample)
    if c.light_bytes:
        return f"{what}: {c.heavy} holds {fmt(c.heavy_bytes)}, {c.light} only {fmt(c.light_bytes)} ({times(c.ratio)})."
    return f"{what}: {c.heavy} holds {fmt(c.heavy_bytes)}, {c.light} nothing."


def explain_imbalance(e: Imbalance) -> Explanation:
    main = e.main
    detail = " ".join(_line(c) for c in (main, *e.others))
    if e.modules:
        detail += f" On {main.heavy}: {list_names(e.modules)}."
    if e.oom is not None:
        detail += f" Rank {e.oom.rank} ran out of memory on {e.oom.device}, the fuller side" + (
            f", in {module_label(e.oom.module)}." if e.oom.module is not None else "."
        )
    if e.manual:
        fix = (
            "Split by bytes, not by module count: move whole blocks from the full device to the empty one until "
            "both hold about the same. Better, let an engine shard every layer over every GPU (FSDP with an "
            "auto-wrap policy, or DeepSpeed ZeRO-3) instead of placing modules by hand."
        )
    else:
        fix = (
            "Give every rank the same share: shard what the heavy side holds whole (an FSDP auto-wrap policy or "
            "ZeRO-3 instead of modules kept on one rank), or move layers from the heavy rank to the light one."
        )
    return Explanation(
        title=f"{main.heavy[0].upper()}{main.heavy[1:]} holds {fmt(main.heavy_bytes)}, {main.light} only "
        f"{fmt(main.light_bytes)} ({KIND_TITLES[main.kind]})",
        detail=detail,
        fix=fix,
        severity="error" if e.oom is not None else "warning",
        saving_bytes=max(0, main.heavy_bytes - main.mean_bytes),
        modules=e.modules,
    )


IMBALANCE = Rule("placement-imbalance", find_imbalance, explain_imbalance)


# -- cuda-context-on-wrong-gpu ------------------------------------------------------------------


@dataclass(frozen=True)
class StrayContext:
    rank: int
    pid: int
    host: str
    own_device: str
    gpu: int


@dataclass(frozen=True)
class WrongGpu(Evidence):
    contexts: tuple[StrayContext, ...]
    gpus_seen: int


def find_wrong_gpu(m: RunModel) -> WrongGpu | None:
    """NVML lists a rank's pid on a GPU other than the rank's own (``.cuda()`` without set_device).

    Not in a rehearsal: each rehearsed rank is the only process of its node there (``LOCAL_RANK=0``) on
    the one GPU it is shown (``CUDA_VISIBLE_DEVICES``), so it cannot touch another rank's GPU, and
    NVML's index for that GPU need not be the rank's ``cuda:0``.
    """
    if m.rehearsal is not None:
        return None
    by_pid = {(r.host, r.pid): r for r in m.ranks if r.pid}
    found: dict[tuple[int, int], StrayContext] = {}
    seen = 0
    samples = {host: m.state.gpus.get(host, ()) for host in m.hosts}
    for story in m.ooms:
        if story.oom.gpus:
            samples[story.oom.host] = tuple(story.oom.gpus)
    for host, gpus in samples.items():
        seen += len(gpus)
        for g in gpus:
            for pid in g.pids:
                r = by_pid.get((host, pid))
                if r is not None and _CUDA_INDEX.match(r.device) and r.device != f"cuda:{g.index}":
                    found[(r.rank, g.index)] = StrayContext(r.rank, pid, host, r.device, g.index)
    if not found:
        return None
    return WrongGpu(tuple(found[k] for k in sorted(found)), seen)


def explain_wrong_gpu(e: WrongGpu) -> Explanation:
    lines = [
        f"GPU {c.gpu} also lists rank {c.rank}'s process (pid {c.pid}), whose own device is {c.own_device}"
        for c in e.contexts
    ]
    gpus = sorted({c.gpu for c in e.contexts})
    detail = (
        "; ".join(lines)
        + ". Each such process keeps a CUDA context there, and whatever it allocates on a GPU that is not its "
        "own — typically from `.to(\"cuda\")`, `.cuda()` or `torch.cuda.*` calls made before "
        "`torch.cuda.set_device`, which all mean cuda:0 on every rank"
        + (f", so GPU {gpus[0]} fills first." if len(gpus) == 1 else ".")
    )
    return Explanation(
        title=f"{len(e.contexts)} rank(s) hold a CUDA context on a GPU that is not theirs",
        detail=detail,
        fix=(
            "Call `torch.cuda.set_device(local_rank)` first thing in each process, and use the rank's own device "
            "(`self.device` in a LightningModule, `torch.device('cuda', local_rank)` elsewhere) instead of "
            '`"cuda"` or `.cuda()`.'
        ),
        severity="warning",
        saving_bytes=None,  # NVML's process list is kept without each process's bytes: no saving follows
    )


WRONG_GPU = Rule("cuda-context-on-wrong-gpu", find_wrong_gpu, explain_wrong_gpu)
