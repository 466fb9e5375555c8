"""Everything a report says, read once from a run directory."""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from typing import Any

from shardtop.diagnose import Finding, diagnose
from shardtop.diagnose.facts import RankFacts, RunFacts
from shardtop.events import GpuMemory, Oom, read_all
from shardtop.report.tree_summary import build_model
from shardtop.run_state import RunState, fold
from shardtop.runs import RunDirectory, RunStatus
from shardtop.shard_model import ShardModel


@dataclass(frozen=True)
class ReportData:
    run: RunDirectory
    meta: dict[str, Any]
    status: RunStatus
    state: RunState
    facts: RunFacts
    findings: tuple[Finding, ...]
    skipped: dict[str, int]
    """Unreadable event lines by reason: bad, unknown, newer, torn."""
    model: ShardModel | None

    @property
    def skipped_total(self) -> int:
        return sum(self.skipped.values())

    @property
    def preset(self) -> str:
        return str(self.meta.get("preset") or "")

    @property
    def command(self) -> str:
        command = self.meta.get("command")
        if isinstance(command, list):
            return shlex.join(str(c) for c in command)
        return str(command or "")

    @property
    def program(self) -> str:
        for rs in self.state.ranks.values():
            if rs.hello is not None and rs.hello.program:
                return rs.hello.program
        config = self.meta.get("config")
        return str(config.get("program", "")) if isinstance(config, dict) else ""

    @property
    def versions(self) -> dict[str, str]:
        for _, rs in sorted(self.state.ranks.items()):
            if rs.hello is not None and rs.hello.versions:
                return dict(rs.hello.versions)
        return {}

    @property
    def status_text(self) -> str:
        """The run's status, told from the ranks' own exits when no launcher recorded one.

        A script run with ``ShardtopCallback`` or ``shardtop.probe`` has no
        supervisor to write ``exit.json``: once its processes are gone it reads
        ``lost``, although every rank said how it left.
        """
        described = self.status.describe()
        exits = [rs.exit for rs in self.state.ranks.values()]
        if self.status.state != "lost" or not exits or any(e is None for e in exits):
            return described
        ok = all(e is not None and e.status == "ok" for e in exits)
        return f"{'finished' if ok else 'failed'} (every rank reported its exit; no launcher recorded one)"

    @property
    def oom(self) -> Oom | None:
        ooms = self.state.ooms
        return ooms[0] if ooms else None


def gather(run: RunDirectory) -> ReportData:
    events, skipped = read_all(run.events_dir)
    state = fold(events, sum(skipped.values()))
    return ReportData(
        run=run,
        meta=run.read_meta(),
        status=run.status(),
        state=state,
        facts=RunFacts.of(state),
        findings=tuple(diagnose(state)),
        skipped=skipped,
        model=build_model(state),
    )


def rank_gpu(data: ReportData, r: RankFacts) -> GpuMemory | None:
    """The NVML reading of the GPU a rank was given, from its node's latest sample."""
    if not r.device.startswith("cuda:"):
        return None
    try:
        index = int(r.device.split(":", 1)[1])
    except ValueError:
        return None
    for gpu in data.state.gpus.get(r.host, ()):
        if gpu.index == index:
            return gpu
    return None


def allocator_peak(r: RankFacts) -> int | None:
    """The allocator's peak, else its latest reading; None on CPU (no allocator to ask)."""
    m = r.memory
    if m is None:
        return None
    values = [v for v in (m.peak, m.allocated, r.oom.allocated if r.oom else None) if v is not None]
    return max(values) if values else None


def rank_of_pid(data: ReportData) -> dict[int, int]:
    return {r.pid: r.rank for r in data.facts.ranks if r.pid}
