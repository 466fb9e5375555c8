"""What CUDA's caching allocator shows: free memory it holds but cannot hand out (fragmentation
at an OOM), and device memory used outside it (CUDA context, NCCL buffers, other libraries).

Both need a GPU: the allocator's reserved and allocated bytes, and NVML's reading of the GPU,
taken at one moment by one rank (its OOM record, or a sample the GPU's sampling rank took of
its own GPU during training).  Samples of two ranks taken at different moments are not mixed.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from shardtop.diagnose.facts import OomEvidence, fmt
from shardtop.diagnose.finding import Evidence, Explanation, Rule
from shardtop.read.rank_facts import RankFacts
from shardtop.read.run_model import RunModel
from shardtop.rundir.memory_figures import GpuMemory

_CUDA_INDEX = re.compile(r"^cuda:(\d+)$")

FRAGMENTED_MIN_SHARE = 0.1
"""Reserved but unallocated memory at an OOM is fragmentation worth a finding from a tenth of the
memory the rank may use: the allocator keeps a few MiB of slack in any run (61 KiB in the
recorded H200 OOMs)."""

OUTSIDE_MIN_BYTES = 4 << 30
"""Memory outside the allocator is worth a finding from 4 GiB: about twice the most the recorded
H200 runs had there (1.35–2.03 GiB: the CUDA context, cuBLAS workspaces, NCCL on two GPUs;
torch 2.11)."""

TYPICAL_OUTSIDE_BYTES = 2 << 30
"""About what the recorded H200 runs had outside the allocator anyway; only the excess is
something to find and free."""


def _expandable(conf: str | None) -> bool:
    return bool(conf) and "expandable_segments:true" in (conf or "").replace(" ", "").lower()


# -- allocator-fragmentation -------------------------------------------------------------------


@dataclass(frozen=True)
class Fragmented(Evidence):
    oom: OomEvidence
    cached_free: int
    """Reserved minus allocated when the rank ran out: free memory the allocator held in blocks."""
    cap: int
    alloc_conf: str | None
    """``PYTORCH_CUDA_ALLOC_CONF`` as the rank saw it (None: unset)."""

    @property
    def share(self) -> float:
        return self.cached_free / max(self.cap, 1)

    @property
    def would_fit(self) -> bool:
        """The request was no larger than the free memory the allocator held, in pieces."""
        return bool(self.oom.requested_bytes) and self.cached_free >= (self.oom.requested_bytes or 0)


def find_fragmented(m: RunModel) -> Fragmented | None:
    for story in m.ooms:
        o = story.oom
        cap = o.limit or o.total
        if not o.device.startswith("cuda") or o.allocated is None or o.reserved is None or not cap:
            continue
        free = o.reserved - o.allocated
        if free >= FRAGMENTED_MIN_SHARE * cap:
            rank = m.rank(o.rank)
            conf = rank.hello.alloc_conf if rank is not None and rank.hello is not None else None
            return Fragmented(OomEvidence.of(story, len(m.ooms)), free, cap, conf)
    return None


def explain_fragmented(e: Fragmented) -> Explanation:
    o = e.oom
    detail = (
        f"When rank {o.rank} ran out of memory on {o.device} during {o.phase}, its allocator had "
        f"{fmt(o.reserved)} reserved but {fmt(o.allocated)} allocated: {fmt(e.cached_free)} ({e.share:.0%} of the "
        f"{fmt(e.cap)} it may use) sat free in cached blocks"
    )
    if e.would_fit:
        detail += (
            f", more than the {fmt(o.requested_bytes)} it asked for, yet in no block large enough: the free memory "
            "was fragmented between live tensors."
        )
    elif o.requested_bytes:
        detail += f"; the {fmt(o.requested_bytes)} it asked for was larger still."
    else:
        detail += "."
    if _expandable(e.alloc_conf):
        fix = (
            f"expandable_segments is already on (`{e.alloc_conf}`). Record where the holes come from with "
            "`torch.cuda.memory._record_memory_history()` and `torch.cuda.memory._dump_snapshot()`, and free or "
            "reuse the long-lived tensors allocated between short-lived ones."
        )
    else:
        was = f" (it is `{e.alloc_conf}` now)" if e.alloc_conf else ""
        fix = (
            f"Try `PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True` in every rank's environment{was} (PyTorch "
            "2.1 and later): the allocator then grows its segments in place, so free space at their ends is "
            "reused. It cannot move live tensors: where the holes lie between long-lived tensors (on an H200, "
            "tensors of a few MiB freed every other one under a per-process cap still failed with it on), "
            "free or reuse the long-lived tensors allocated between short-lived ones."
        )
        if o.phase in ("forward", "backward", "optimizer", "validation"):
            fix += (
                " Tensors whose size changes from step to step (variable sequence lengths) fragment most: "
                "padding batches to a few fixed shapes helps too."
            )
    return Explanation(
        title=f"{fmt(e.cached_free)} free in the allocator's cache at rank {o.rank}'s OOM "
        f"({e.share:.0%} of its {fmt(e.cap)}): fragmentation",
        detail=detail,
        fix=fix,
        severity="error" if e.would_fit else "warning",
        saving_bytes=e.cached_free,
        modules=(o.module,) if o.module is not None else (),
    )


FRAGMENTED = Rule("allocator-fragmentation", find_fragmented, explain_fragmented)


# -- memory-outside-pytorch ----------------------------------------------------------------------


@dataclass(frozen=True)
class OutsideSample:
    rank: int
    host: str
    gpu: int
    used: int
    """NVML's memory in use on the rank's GPU."""
    reserved: int
    """The rank's allocator's reserved bytes at the same moment."""
    total: int
    when: str
    """``at its OOM`` or ``step 3, backward``."""
    pids_listed: bool
    """NVML listed the GPU's processes (only the rank's); False: it listed none (usual in a
    container), and other processes' memory would count here too."""

    @property
    def outside(self) -> int:
        return self.used - self.reserved


@dataclass(frozen=True)
class OutsidePytorch(Evidence):
    worst: OutsideSample
    others: tuple[OutsideSample, ...]
    world_size: int
    oom: OomEvidence | None
    """The OOM of the worst sample, when the memory outside PyTorch beyond the usual exceeds its request."""
    rehearsal: bool = False
    """A rehearsal: the fake process group made no NCCL communicator, so none of this is NCCL's."""

    @property
    def excess(self) -> int:
        return max(0, self.worst.outside - TYPICAL_OUTSIDE_BYTES)


def _own_gpu(r: RankFacts, gpus: list[GpuMemory] | tuple[GpuMemory, ...]) -> tuple[GpuMemory, bool] | None:
    """The rank's own GPU in an NVML sample, and whether its process list was read; None where the
    GPU lists another process (its memory would be counted as the rank's)."""
    found = _CUDA_INDEX.match(r.device)
    if found is None:
        return None
    g = next((g for g in gpus if g.index == int(found.group(1))), None)
    if g is None or (g.pids and set(g.pids) != {r.pid}):
        return None
    return g, bool(g.pids)


def outside_samples(m: RunModel, min_bytes: int = OUTSIDE_MIN_BYTES) -> list[tuple[OutsideSample, OomEvidence | None]]:
    """Each rank's largest reading of memory outside the allocator, from ``min_bytes`` up, with
    the rank's OOM when the reading is the one taken at it."""
    out = []
    for r in m.ranks:
        best: tuple[OutsideSample, OomEvidence | None] | None = None
        story = next((s for s in m.ooms if s.rank == r.rank), None)
        o = story.oom if story is not None else None
        if o is not None and o.gpus and o.reserved is not None and (own := _own_gpu(r, o.gpus)) is not None:
            g, listed = own
            best = (OutsideSample(r.rank, r.host, g.index, g.used, o.reserved, g.total, "at its OOM", listed),
                    OomEvidence.of(story, len(m.ooms)) if story is not None else None)
        for p in reversed(r.state.phase_samples):
            mem = p.memory
            if mem.gpus is None or mem.reserved is None or (own := _own_gpu(r, mem.gpus)) is None:
                continue
            g, listed = own
            sample = OutsideSample(
                r.rank, r.host, g.index, g.used, mem.reserved, g.total, f"step {p.step}, {p.phase}", listed
            )
            if best is None or sample.outside > best[0].outside:
                best = (sample, None)
            break  # the latest training sample of the rank's own GPU
        if best is not None and best[0].outside >= min_bytes:
            out.append(best)
    return out


def find_outside_pytorch(m: RunModel) -> OutsidePytorch | None:
    found = outside_samples(m)
    if not found:
        return None
    worst, oom = max(found, key=lambda pair: pair[0].outside)
    others = tuple(s for s, _ in found if s is not worst)
    evidence = OutsidePytorch(worst, others, m.world_size, None, m.rehearsal is not None)
    if oom is not None and oom.requested_bytes and evidence.excess >= oom.requested_bytes:
        evidence = OutsidePytorch(worst, others, m.world_size, oom, evidence.rehearsal)
    return evidence


def explain_outside_pytorch(e: OutsidePytorch) -> Explanation:
    w = e.worst
    detail = (
        f"NVML counts {fmt(w.used)} in use on GPU {w.gpu} ({w.host}), while rank {w.rank}'s allocator had "
        f"{fmt(w.reserved)} reserved ({w.when}): {fmt(w.outside)} of the GPU is held outside PyTorch's allocator"
        + (f", {w.outside / w.total:.0%} of its {fmt(w.total)}." if w.total else ".")
        + f" A CUDA context with cuBLAS workspaces and NCCL's buffers took about {fmt(TYPICAL_OUTSIDE_BYTES)} at "
        "most in runs recorded on H200s; the rest is something else that allocates device memory itself."
    )
    if not w.pids_listed:
        detail += (
            " NVML listed no processes on that GPU (usual inside a container): another process's memory "
            "would count here too."
        )
    if e.others:
        detail += (
            " Also: " + "; ".join(f"rank {s.rank} on GPU {s.gpu}, {fmt(s.outside)} ({s.when})" for s in e.others) + "."
        )
    if e.oom is not None:
        detail += (
            f" Rank {e.oom.rank} ran out of memory asking for {fmt(e.oom.requested_bytes)}, less than the "
            f"{fmt(e.excess)} beyond the usual."
        )
    if e.rehearsal:
        detail += (
            " This is a rehearsal: no NCCL communicator was made, so none of it is NCCL's, and the job's ranks "
            "will hold NCCL's buffers on top of it."
        )
    nccl = (
        " NCCL's buffers grow with the number of GPUs and channels (`NCCL_BUFFSIZE`, `NCCL_MAX_NCHANNELS`)."
        if e.world_size > 1 and not e.rehearsal
        else ""
    )
    fix = (
        "Find what allocates outside PyTorch: another framework in the process (JAX and TensorFlow reserve most of "
        "the GPU unless told not to: `XLA_PYTHON_CLIENT_PREALLOCATE=false`, `tf.config.experimental."
        "set_memory_growth`), a CUDA extension or library calling cudaMalloc itself, CUDA graphs, or a second "
        "CUDA context in the process." + nccl + " `torch.cuda.mem_get_info()` next to `torch.cuda.memory_reserved()` "
        "shows the gap from inside the rank."
    )
    return Explanation(
        title=f"{fmt(w.outside)} of GPU {w.gpu} is used outside PyTorch's allocator (rank {w.rank})",
        detail=detail,
        fix=fix,
        severity="error" if e.oom is not None else "warning",
        saving_bytes=e.excess or None,
    )


OUTSIDE_PYTORCH = Rule("memory-outside-pytorch", find_outside_pytorch, explain_outside_pytorch)
