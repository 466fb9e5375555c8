"""A rank's memory set against something: what it may use, how it grows, and the other ranks at the same moment.

What a rank may use before it runs out is its cap, else its GPU's memory
(NVML), else, on CPU, the host's; growth is told against that limit.  Ranks
are compared like with like only: every rank's allocator sample from one step
and phase, or a node's NVML sample taken while all its ranks were up and
training, and never in a rehearsal, whose ranks ran one after another on one
device.  ``RunModel`` asks these once per run.  Pure Python: no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType

from shardtop.read.memory_growth import Growth, growth
from shardtop.read.rank_facts import RankFacts
from shardtop.read.run_state import GpuSample
from shardtop.rundir.events import Memory
from shardtop.rundir.memory_figures import GpuMemory
from shardtop.rundir.run_config import RehearsalConfig

PHASE_ORDER = {"forward": 0, "backward": 1, "optimizer": 2}


@dataclass(frozen=True)
class ComparableMemory:
    """Every rank's allocator sample from one step and phase: a like-with-like comparison."""

    step: int
    phase: str
    samples: Mapping[int, Memory]


def rank_gpu(r: RankFacts, gpus: Mapping[str, tuple[GpuMemory, ...]]) -> GpuMemory | None:
    """The NVML reading of the GPU a rank was given, from its node's latest sample in ``gpus`` (by host)."""
    if not r.device.startswith("cuda:"):
        return None
    try:
        index = int(r.device.split(":", 1)[1])
    except ValueError:
        return None
    return next((g for g in gpus.get(r.host, ()) if g.index == index), None)


def rank_memory_limit(r: RankFacts, gpus: Mapping[str, tuple[GpuMemory, ...]]) -> int | None:
    """What the rank may use before it runs out: its cap, else its GPU's memory (NVML), else, on CPU,
    the host's memory limit or memory."""
    m = r.memory
    if m is not None and m.limit:
        return m.limit
    if r.device.startswith("cuda:"):
        gpu = rank_gpu(r, gpus)
        return gpu.total if gpu is not None and gpu.total else None
    hello = r.hello
    if hello is None:
        return None
    return hello.host_memory_limit or hello.host_memory


def growth_by_rank(ranks: Sequence[RankFacts], gpus: Mapping[str, tuple[GpuMemory, ...]]) -> Mapping[int, Growth]:
    """Each rank whose memory climbs steadily from step to step, and where it leads."""
    found: dict[int, Growth] = {}
    for r in ranks:
        g = growth(r.state.step_memory, rank_memory_limit(r, gpus))
        if g is not None:
            found[r.rank] = g
    return MappingProxyType(found)


def same_step_memory(
    ranks: Sequence[RankFacts], world_size: int, rehearsal: RehearsalConfig | None
) -> ComparableMemory | None:
    """Every rank's allocator sample from the latest step and phase that all of them reached
    alive; None unless every rank of the run has one (a rank gone or not yet training
    leaves nothing to compare it with), and None for a rehearsal, whose ranks ran one after
    another on one device and were never alive together."""
    if rehearsal is not None or len(ranks) < max(world_size, 2):
        return None
    keyed = [{(p.step, p.phase): p.memory for p in r.state.phase_samples} for r in ranks]
    common = set(keyed[0]).intersection(*keyed[1:])
    if not common:
        return None
    step, phase = max(common, key=lambda k: (k[0], PHASE_ORDER.get(k[1], -1)))
    by_rank = {r.rank: k[(step, phase)] for r, k in zip(ranks, keyed, strict=True)}
    return ComparableMemory(step, phase, MappingProxyType(by_rank))


def same_step_gpus(
    ranks: Sequence[RankFacts],
    gpu_samples: Mapping[str, tuple[GpuSample, ...]],
    host: str,
    rehearsal: RehearsalConfig | None,
) -> GpuSample | None:
    """The latest NVML sample of ``host`` taken while every rank there was up and training; None
    for a rehearsal (its ranks shared one device, one at a time: no sample shows the job's GPUs)."""
    on_host = [r for r in ranks if r.host == host]
    if not on_host or rehearsal is not None:
        return None
    ups = [r.hello.t for r in on_host if r.hello is not None]
    if len(ups) < len(on_host):
        return None
    lefts = [t for r in on_host if (t := r.state.left_at) is not None]
    for sample in reversed(gpu_samples.get(host, ())):
        if sample.t < max(ups) or (lefts and sample.t >= min(lefts)):
            continue
        if all(any(p.step >= sample.step for p in r.state.phase_samples) for r in on_host):
            return sample
    return None
