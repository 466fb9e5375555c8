"""Everything a report says, read once from a run directory: the read model, its findings, the tree."""

from __future__ import annotations

from dataclasses import dataclass

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

    @property
    def skipped(self) -> dict[str, int]:
        """Unreadable event lines by reason: bad, unknown, newer, torn (every reason, zeros too)."""
        by = self.model.state.skipped_by
        return {reason: by.get(reason, 0) for reason in ("bad", "unknown", "newer", "torn")} | dict(by)


def gather(run: RunDirectory) -> ReportData:
    model = read_run(run)
    return ReportData(run=run, model=model, findings=tuple(diagnose(model)), tree=ShardModel.of(model.state))


def rank_of_pid(model: RunModel) -> dict[int, int]:
    return {r.pid: r.rank for r in model.ranks if r.pid}
