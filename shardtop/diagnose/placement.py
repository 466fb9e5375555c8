"""Where the bytes ended up: devices, ranks or GPUs very unevenly loaded (story 1: GPU 0
fills, GPU 1 holds 3 MB).  Reads shard bytes per device and per rank, the allocator's
peaks and NVML's view of the run's GPUs.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from shardtop.diagnose.facts import RankFacts, RunFacts, covering_rows, display_path, fmt, list_names
from shardtop.diagnose.finding import Finding
from shardtop.events import GpuMemory, Oom

IMBALANCE_RATIO = 2.0
"""Two devices (or ranks) are "very uneven" when one holds at least twice what the other
holds: the fuller one then runs out of memory at half the model size the pair could fit."""

SHARD_IMBALANCE_MIN_BYTES = 8 << 20
"""Parameter bytes that differ by less than 8 MiB are not worth a finding on any GPU."""

MEMORY_IMBALANCE_MIN_BYTES = 1 << 30
"""Allocator and NVML readings include CUDA contexts, caches and workspaces (hundreds of
MiB each): only a gap of 1 GiB or more says something about where the model went."""

NO_STORAGE_DEVICES = ("cpu", "meta", "nvme", "disk")
"""Not accelerators: a model split between a GPU and the CPU is offload, not placement."""

_CUDA_INDEX = re.compile(r"^cuda:(\d+)$")


@dataclass(frozen=True)
class Imbalance:
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

    @property
    def ratio(self) -> float:
        return self.heavy_bytes / max(self.light_bytes, 1)


def _times(ratio: float) -> str:
    return "over 100×" if ratio > 100 else f"{ratio:.0f}×" if ratio >= 10 else f"{ratio:.1f}×"


def _uneven(values: dict[str, int], min_gap: int) -> tuple[str, int, str, int, int] | None:
    if len(values) < 2:
        return None
    heavy = max(values, key=values.__getitem__)
    light = min(values, key=values.__getitem__)
    hi, lo = values[heavy], values[light]
    if hi - lo < min_gap or hi < IMBALANCE_RATIO * max(lo, 1):
        return None
    return heavy, hi, light, lo, sum(values.values()) // len(values)


def _device_imbalances(f: RunFacts) -> list[Imbalance]:
    out = []
    for r in f.ranks:
        accel = {d: b for d, b in r.by_device.items() if not d.startswith(NO_STORAGE_DEVICES)}
        found = _uneven(accel, SHARD_IMBALANCE_MIN_BYTES)
        if found:
            heavy, hi, light, lo, mean = found
            out.append(Imbalance("devices", heavy, hi, light, lo, mean, rank=r.rank, device=heavy))
    return out


def _rank_imbalance(f: RunFacts) -> Imbalance | None:
    # Like with like: while a live run comes up, one rank's set-up snapshot (whole) must not be
    # weighed against another's engine snapshot (sharded).
    pool = [r for r in f.ranks if r.shards is not None] or [r for r in f.ranks if r.setup is not None]
    held = {f"rank {r.rank}": r.param_bytes for r in pool}
    found = _uneven(held, SHARD_IMBALANCE_MIN_BYTES)
    if not found:
        return None
    heavy, hi, light, lo, mean = found
    rank = int(heavy.split()[1])
    return Imbalance("ranks", heavy, hi, light, lo, mean, rank=rank, device=_rank(f, rank).device)


def _allocator_imbalance(f: RunFacts) -> Imbalance | None:
    peaks = {}
    for r in f.ranks:
        m = r.memory
        if m is None or not m.device.startswith("cuda"):
            continue
        value = max(v for v in (m.peak, m.allocated, r.oom.allocated if r.oom else None, 0) if v is not None)
        if value:
            peaks[f"rank {r.rank}"] = value
    found = _uneven(peaks, MEMORY_IMBALANCE_MIN_BYTES)
    if not found:
        return None
    heavy, hi, light, lo, mean = found
    rank = int(heavy.split()[1])
    return Imbalance("allocator", heavy, hi, light, lo, mean, rank=rank, device=_rank(f, rank).device)


def _run_gpus(f: RunFacts) -> dict[str, list[GpuMemory]]:
    """Per host, the NVML sample of the GPUs this run's ranks were given or use.

    The sample taken at an OOM wins over the latest one: it shows the moment that mattered.
    """
    samples: dict[str, list[GpuMemory]] = {h: list(g) for h, g in f.state.gpus.items()}
    for o in f.ooms:
        if o.gpus:
            samples[o.host] = list(o.gpus)
    pids = {r.pid for r in f.ranks if r.pid}
    out = {}
    for host, gpus in samples.items():
        assigned = {int(m.group(1)) for r in f.ranks if r.host == host and (m := _CUDA_INDEX.match(r.device))}
        mine = [g for g in gpus if g.index in assigned or pids.intersection(g.pids)]
        if len(mine) >= 2:
            out[host] = mine
    return out


def _gpu_imbalances(f: RunFacts) -> tuple[list[Imbalance], list[str]]:
    """Uneven GPUs of the run, and notes on ranks using a GPU that is not theirs."""
    out, notes = [], []
    by_pid = {r.pid: r for r in f.ranks if r.pid}
    for host, gpus in _run_gpus(f).items():
        used = {f"GPU {g.index}" + (f" on {host}" if len(f.state.gpus) > 1 else ""): g.used for g in gpus}
        found = _uneven(used, MEMORY_IMBALANCE_MIN_BYTES)
        if found:
            heavy, hi, light, lo, mean = found
            index = int(heavy.split()[1])
            out.append(Imbalance("gpus", heavy, hi, light, lo, mean, device=f"cuda:{index}"))
        for g in gpus:
            for pid in g.pids:
                r = by_pid.get(pid)
                if r is not None and r.host == host and r.device.startswith("cuda") and r.device != f"cuda:{g.index}":
                    notes.append(
                        f"GPU {g.index} also holds memory of rank {r.rank} (pid {pid}), whose own device is "
                        f'{r.device}: that rank put tensors on a GPU that is not its own — typically `.to("cuda")` '
                        "or `.cuda()` without torch.cuda.set_device, which means cuda:0 on every rank."
                    )
    return out, notes


def _rank(f: RunFacts, rank: int) -> RankFacts:
    return next(r for r in f.ranks if r.rank == rank)


def _modules_on(f: RunFacts, imbalance: Imbalance) -> list[str]:
    """The outermost modules behind the heavy side, where the shards can tell."""
    tree = f.tree
    if tree is None or imbalance.rank is None:
        return []
    heavy = _rank(f, imbalance.rank).holdings
    if not f.aligned(heavy):
        return []
    assert heavy is not None
    if imbalance.kind == "devices":
        selected = [0 <= d < len(heavy.devices) and heavy.devices[d] == imbalance.heavy for d in heavy.device]
    elif imbalance.kind == "ranks":
        light_rank = int(imbalance.light.split()[1])
        light = _rank(f, light_rank).holdings
        if not f.aligned(light):
            return []
        assert light is not None
        selected = [a > b for a, b in zip(heavy.bytes, light.bytes)]
    else:
        return []
    has = [b > 0 for b in tree.bytes]
    return [f.path(row) for row in covering_rows(selected, has, tree.parents)]


def _oom_on(f: RunFacts, imbalance: Imbalance) -> Oom | None:
    for o in f.ooms:
        if imbalance.rank is not None and imbalance.kind != "devices" and o.rank == imbalance.rank:
            return o
        if imbalance.device is not None and o.device == imbalance.device:
            return o
    return None


KIND_TITLES = {
    "devices": "parameters per device",
    "ranks": "parameters per rank",
    "gpus": "GPU memory in use",
    "allocator": "allocator peak",
}

KIND_WORDS = {
    "devices": "parameter bytes per device within rank {rank}",
    "ranks": "parameter bytes per rank",
    "gpus": "GPU memory in use (NVML)",
    "allocator": "allocator peak per rank",
}


def placement_imbalance(f: RunFacts) -> Finding | None:
    """Bytes very unevenly spread over devices or ranks (story 1: GPU 0 fills, GPU 1 holds 3 MB)."""
    gpu_found, notes = _gpu_imbalances(f)
    found = [
        *_device_imbalances(f),
        *filter(None, [_rank_imbalance(f)]),
        *gpu_found,
        *filter(None, [_allocator_imbalance(f)]),
    ]
    if not found:
        return None
    main = max(found, key=lambda i: (_oom_on(f, i) is not None, i.heavy_bytes - i.light_bytes))
    lines = [
        f"{KIND_WORDS[i.kind].format(rank=i.rank)}: {i.heavy} holds {fmt(i.heavy_bytes)}, {i.light} only "
        f"{fmt(i.light_bytes)} ({_times(i.ratio)})."
        if i.light_bytes
        else f"{KIND_WORDS[i.kind].format(rank=i.rank)}: {i.heavy} holds {fmt(i.heavy_bytes)}, {i.light} nothing."
        for i in sorted(found, key=lambda i: i is not main)
    ]
    detail = " ".join(lines + notes)
    modules = _modules_on(f, main)
    if modules:
        detail += f" On {main.heavy}: {list_names(modules)}."
    oom = _oom_on(f, main)
    if oom is not None:
        detail += f" Rank {oom.rank} ran out of memory on {oom.device}, the fuller side" + (
            f", in {display_path(oom.module)}." if oom.module else "."
        )
    if main.kind == "devices" or f.engine == "manual":
        fix = (
            "Split by bytes, not by module count: move whole blocks from the full device to the empty one until "
            "both hold about the same. Better, let an engine shard every layer over every GPU (FSDP with an "
            "auto-wrap policy, or DeepSpeed ZeRO-3) instead of placing modules by hand."
        )
    elif notes:
        fix = (
            "Call `torch.cuda.set_device(local_rank)` first thing in each process, and use the rank's own device "
            "(`self.device` in a LightningModule, `torch.device('cuda', local_rank)` elsewhere) instead of "
            '`"cuda"` or `.cuda()`.'
        )
    else:
        fix = (
            "Give every rank the same share: shard what the heavy side holds whole (an FSDP auto-wrap policy or "
            "ZeRO-3 instead of modules kept on one rank), or move layers from the heavy rank to the light one."
        )
    return Finding(
        code="placement-imbalance",
        title=f"{main.heavy[0].upper()}{main.heavy[1:]} holds {fmt(main.heavy_bytes)}, {main.light} only "
        f"{fmt(main.light_bytes)} ({KIND_TITLES[main.kind]})",
        detail=detail,
        fix=fix,
        severity="error" if oom is not None else "warning",
        saving_bytes=max(0, main.heavy_bytes - main.mean_bytes),
        modules=tuple(modules),
        evidence={
            "kind": main.kind,
            "heavy": main.heavy,
            "heavy_bytes": main.heavy_bytes,
            "light": main.light,
            "light_bytes": main.light_bytes,
            "ratio": round(main.ratio, 2) if main.light_bytes else 0.0,
            "comparisons": len(found),
        },
    )
