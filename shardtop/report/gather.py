"""Everything a report says, read once from a run directory: the read model, its findings, the tree."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

from shardtop.diagnose import Finding, diagnose
from shardtop.read.run_model import RunModel
from shardtop.read.shard_model import ShardModel
from shardtop.read.whole_run import read_run
from shardtop.rundir.run_directory import RunDirectory


@dataclass(frozen=True)
class ReportData:
    run: RunDirectory
    model: RunModel
    findings: tuple[Finding, ...]
    tree: ShardModel | None
    rank_of_pid: Mapping[int, int]
    """Each rank's process id -> its rank, to name the ranks behind an OOM's GPU processes."""

    @property
    def skipped(self) -> dict[str, int]:
        """Unreadable event lines by reason: bad, unknown, newer, torn (every reason, zeros too)."""
        by = self.model.state.skipped_by
        return {reason: by.get(reason, 0) for reason in ("bad", "unknown", "newer", "torn")} | dict(by)


def gather(run: RunDirectory) -> ReportData:
    """Read the run and derive every fact the renderings show; they read ``ReportData`` and nothing else."""
    model = read_run(run)
    return ReportData(
        run=run,
        model=model,
        findings=tuple(diagnose(model)),
        tree=ShardModel.of(model.state),
        rank_of_pid=MappingProxyType({r.pid: r.rank for r in model.ranks if r.pid}),
    )
