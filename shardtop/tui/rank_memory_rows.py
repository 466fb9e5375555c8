"""What each rank's memory bar shows (``RankMemoryRow``), read off the read model.

``rank_rows`` turns a ``RunModel`` into one row per rank: allocated, reserved
and peak bytes (the OOM's when it came after the latest sample), the rank's
limit and GPU, its status and what fills its memory by kind.
``RankMemory`` draws the rows as bars, ``host_memory`` as one line per host.
Pure: no Textual.
"""

from __future__ import annotations

from dataclasses import dataclass

from shardtop.read.memory_growth import Growth
from shardtop.read.rank_facts import RankStatus, held
from shardtop.read.run_model import RunModel
from shardtop.read.run_state import RankState
from shardtop.rundir.memory_figures import GpuMemory, MemorySplit
from shardtop.tui.bar_scale import host_scale, may_use_words
from shardtop.tui.memory_bar import BarPart, bar_parts
from shardtop.tui.over_time import shows_over_time


@dataclass(frozen=True, slots=True)
class RankMemoryRow:
    """What one rank's bar shows."""

    rank: int
    host: str
    device: str
    pid: int | None
    allocated: int | None
    reserved: int | None
    peak: int | None
    limit: int | None
    host_rss: int
    gpu: GpuMemory | None
    """The NVML view of the rank's GPU (matched by pid, else by device index)."""
    status: RankStatus
    parts: tuple[BarPart, ...] = ()
    """What fills the rank's memory now, by kind, then the cache and memory outside PyTorch
    (``memory_bar.bar_parts``); empty where the probe split nothing (the bar is not stacked then)."""
    may_use: int | None = None
    """What the rank may use before it runs out (``RunModel.memory_limit_of``): its cap or its GPU; on CPU,
    where the bar shows rss, the host's memory limit or memory (``bar_scale.host_scale``)."""
    may_use_words: str = ""
    """What ``may_use`` is: ``cap``, ``GPU``, ``host memory limit`` or ``host memory``."""
    steps: tuple[int, ...] = ()
    """The rank's memory at the start of each step's forward, in step order."""
    growth: Growth | None = None
    """Memory that grows every step, where the read model found it."""

    @property
    def on_cpu(self) -> bool:
        """The rank has no allocator figures: its bar shows its resident memory (rss)."""
        return self.allocated is None

    @property
    def whole(self) -> int | None:
        """What the bar measures against: the limit, else the GPU, else what the rank may use, else the
        allocator's own peak; a CPU rank's rss: the host's memory (limit), never the cap on its data segment."""
        if self.on_cpu:
            return self.may_use
        gpu = self.gpu.total if self.gpu else None
        return self.limit or gpu or self.may_use or self.peak or self.reserved

    @property
    def whole_words(self) -> str:
        """What ``whole`` is, in the title's words; empty where the bar measures against its own peak."""
        if self.on_cpu:
            return self.may_use_words if self.may_use else ""
        if self.limit:
            return "cap"
        if self.gpu is not None and self.gpu.total:
            return "GPU"
        return self.may_use_words if self.may_use else ""

    @property
    def over_time(self) -> bool:
        """The rank has a line over time under its bar (``over_time.shows_over_time``)."""
        return shows_over_time(self.steps, self.growth, self.status)

    @property
    def stacked(self) -> bool:
        """The bar stacks the kinds: a split on a rank with an allocator."""
        return bool(self.parts) and self.allocated is not None

    @property
    def top(self) -> int:
        """The most the bar has to show: the peak or all the parts, whichever is higher."""
        return max(self.peak or 0, sum(p.bytes for p in self.parts))


def device_index(device: str) -> int | None:
    """``cuda:1`` -> 1; None for cpu or an unknown form."""
    head, _, idx = device.partition(":")
    return int(idx) if head == "cuda" and idx.isdigit() else None


def gpu_of(rs: RankState, gpus: tuple[GpuMemory, ...]) -> GpuMemory | None:
    pid = rs.pid
    if pid is not None:
        for g in gpus:
            if pid in g.pids:
                return g
    index = device_index(rs.device)
    return next((g for g in gpus if g.index == index), None)


SAME_MOMENT = 0.05
"""A split whose allocated bytes are this close to the bar's describes the memory the bar shows."""


def split_of(split: MemorySplit | None, allocated: int | None) -> MemorySplit | None:
    """``split`` where it describes ``allocated`` (within ``SAME_MOMENT``), else None: a split taken at a
    census (a phase's start, a few times a second at most) stays the latest while samples move on, and
    its kinds would stack to another moment's total."""
    if split is None or split.allocated is None or allocated is None:
        return split
    return split if abs(split.allocated - allocated) <= SAME_MOMENT * max(allocated, split.allocated) else None


def rank_rows(model: RunModel) -> tuple[RankMemoryRow, ...]:
    rows = []
    for r in model.ranks:
        rs = r.state
        m = rs.memory
        gpus = model.state.gpus.get(rs.host, ())
        allocated, reserved, peak = held(rs)
        parts = bar_parts(split_of(r.memory_now, allocated), r.cache_bytes, r.outside_pytorch_bytes)
        if parts and r.allocator_peak is not None:
            peak = r.allocator_peak  # the mark on a stacked bar is allocated memory's peak
        may_use, words = host_scale(r) if allocated is None else (model.memory_limit_of(r), may_use_words(r))
        rows.append(
            RankMemoryRow(
                rank=rs.rank,
                host=rs.host,
                device=rs.device or "?",
                pid=rs.pid,
                allocated=allocated,
                reserved=reserved,
                peak=peak,
                limit=(m.limit if m else None) or (rs.oom.limit if rs.oom else None),
                host_rss=m.host_rss if m else 0,
                gpu=gpu_of(rs, gpus),
                status=r.status,
                parts=parts,
                may_use=may_use,
                may_use_words=words,
                steps=tuple(s.bytes for s in rs.step_memory),
                growth=model.growth.get(rs.rank),
            )
        )
    return tuple(rows)
