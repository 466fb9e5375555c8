"""``devices=2,4,8``: one rehearsal per job size, one after another, and a table of their peaks.

Each size is a run of its own (``shardtop report`` reads each).  A size fits
when every rehearsed rank finished without running out of memory and, where
``gpu=`` names the job's GPUs, its peak stays within what such a GPU lets
PyTorch use.  The smallest size that fits is said last.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal, TextIO

from shardtop.rehearse.spec import RehearsalSpec
from shardtop.units import format_bytes
from shardtop.words import aligned

if TYPE_CHECKING:
    from shardtop.plan.cards import Gpu
    from shardtop.read.rank_facts import RankStateName
    from shardtop.read.run_model import RunModel


MeasuredBy = Literal["allocator", "host RSS"]
"""What a rank's peak is: the CUDA allocator's (a GPU rank), or the highest resident set of its process (CPU)."""


@dataclass(frozen=True)
class RankPeak:
    """One rehearsed rank of one job size, as its run recorded it."""

    world: int
    rank: int
    status: RankStateName
    peak: int | None
    """The allocator's peak (GPU), else the highest resident set seen (CPU); None if nothing was measured."""
    measured_by: MeasuredBy
    planned: int | None
    """The plan's peak for this rank over the phases it reached, where the run carries a plan."""
    out_of_memory: bool

    def fits(self, gpu: Gpu | None) -> bool:
        if self.out_of_memory or self.status != "finished":
            return False
        return gpu is None or self.measured_by != "allocator" or (self.peak or 0) <= gpu.usable


def peaks_of(model: RunModel, world: int) -> list[RankPeak]:
    """Each rehearsed rank's peak, status and plan, from a rehearsal's read model."""
    planned = {c.rank: c.predicted_peak for c in model.plan_check.ranks} if model.plan_check is not None else {}
    rows: list[RankPeak] = []
    for r in model.ranks:
        allocator = r.allocator_peak
        rss = r.state.peak_host_rss or None
        rows.append(RankPeak(
            world=world,
            rank=r.rank,
            status=r.status.state,
            peak=allocator if allocator is not None else rss,
            measured_by="allocator" if allocator is not None else "host RSS",
            planned=planned.get(r.rank),
            out_of_memory=r.oom is not None,
        ))
    return rows


def table(rows: Sequence[RankPeak], gpu: Gpu | None) -> list[str]:
    """The sweep's table, one line per rank of each size, and the smallest size that fits."""
    header = ("devices", "rank", "status", "peak", "measured by", "plan", "fits")
    lines = [header]
    for row in rows:
        lines.append((
            str(row.world), str(row.rank), row.status,
            format_bytes(row.peak) if row.peak is not None else "-", row.measured_by,
            format_bytes(row.planned) if row.planned is not None else "-",
            "yes" if row.fits(gpu) else "no",
        ))
    out = aligned(lines)
    worlds = sorted({row.world for row in rows})
    fitting = [w for w in worlds if all(row.fits(gpu) for row in rows if row.world == w)]
    against = f" on {gpu.name} ({format_bytes(gpu.usable)} usable)" if gpu is not None else ""
    if fitting:
        out.append(f"smallest job that fits{against}: devices={fitting[0]}")
    else:
        out.append(f"none of devices={','.join(str(w) for w in worlds)} fits{against}")
    return out


def sweep(
    spec: RehearsalSpec, settings: list[str], command: list[str] | None, *,
    runs_dir: str | None, name: str | None, gpu: Gpu | None, out: TextIO, mem_limit: int | None = None,
) -> int:
    """Rehearse each size in turn, followed here; print the table; 0 if some size fits, else 1."""
    from shardtop.read.whole_run import read_run
    from shardtop.rehearse.start import start_one

    rows: list[RankPeak] = []
    for world in spec.worlds:
        started = start_one(spec, world, settings, command, runs_dir=runs_dir, name=name, mem_limit=mem_limit)
        started.follow(out, 1_000_000)
        rows.extend(peaks_of(read_run(started.run), world))
    print("", file=out)
    for line in table(rows, gpu):
        print(line, file=out, flush=True)
    return 0 if any(all(r.fits(gpu) for r in rows if r.world == w) for w in spec.worlds) else 1
