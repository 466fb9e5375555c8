"""The home view's list of runs, with which pid is which run's rank.  It only reads.

Finished runs are summarised once (until their files change); live runs are
followed incrementally, so a long run's event files are not re-read every
poll.  The pids the ranks on this machine announced in their hello events let
the GPU panel say which run and rank a GPU process is (another host's pid
numbers mean nothing here).  The GPUs of other hosts come from the live runs'
events too: each host's local rank 0 samples its GPUs, so a machine without
GPUs of its own (a login node) shows the GPUs of the runs it watches.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType

from shardtop.config import Preset, list_presets
from shardtop.read.follower import RunFollower
from shardtop.read.run_model import RunModel
from shardtop.read.run_state import RankState, RunState
from shardtop.read.run_summary import RunSummary, summarize
from shardtop.rundir.cluster import host_name
from shardtop.rundir.memory_figures import GpuMemory
from shardtop.rundir.run_directory import RunDirectory, list_runs
from shardtop.rundir.run_status import RunStatus
from shardtop.tui.watch.gpu_feed import gpus_as_shown

MAX_RUNS = 50
"""The newest runs shown on the home view."""


@dataclass(frozen=True)
class RunRow:
    summary: RunSummary
    path: Path
    live: bool


@dataclass(frozen=True)
class RankOwner:
    """Which run and rank a pid is."""

    run_id: str
    rank: int


@dataclass(frozen=True)
class HostGpus:
    """Another host's GPUs as a live run's ranks last reported them (NVML, sampled there by local rank 0)."""

    host: str
    run_id: str
    gpus: tuple[GpuMemory, ...]
    """At the precision shown (``gpus_as_shown``), so an unchanged sample is an equal snapshot."""
    owners: Mapping[int, RankOwner]
    """pid on that host -> the run's rank."""


@dataclass(frozen=True)
class RunsSnapshot:
    rows: tuple[RunRow, ...]
    """Newest first."""
    owners: Mapping[int, RankOwner]
    """pid -> run and rank, for the live runs' ranks on this machine."""
    host_gpus: tuple[HostGpus, ...]
    """The GPUs of other hosts that live runs report, one entry per host, hosts in name order."""
    live_ranks: tuple[tuple[str, RankState], ...]
    """(run id, rank) of live runs: their own memory samples, for machines without GPUs."""
    presets: tuple[Preset, ...]
    serial: int


@dataclass
class _LiveRun:
    """A live run's follower, and its summary as of the model it was made from."""

    follower: RunFollower
    model: RunModel | None = None
    summary: RunSummary | None = None


class RunCatalog:
    def __init__(self, root: Path, here: str | None = None) -> None:
        """``here``: this machine's host name (the one its ranks write on their events)."""
        self.root = root
        self.here = here if here is not None else host_name()
        self._summaries: dict[str, tuple[tuple[object, ...], RunSummary]] = {}
        self._live: dict[str, _LiveRun] = {}
        self._presets: tuple[Preset, ...] | None = None
        self._last: tuple[object, ...] | None = None
        self._serial = 0

    def poll(self) -> RunsSnapshot | None:
        if self._presets is None:
            self._presets = tuple(list_presets())
        runs = list_runs(self.root)[-MAX_RUNS:][::-1]
        rows: list[RunRow] = []
        owners: dict[int, RankOwner] = {}
        host_gpus: dict[str, HostGpus] = {}
        live_ranks: list[tuple[str, RankState]] = []
        for run in runs:
            status = run.status()
            live = status.state == "running"
            if live:
                summary, state = self._follow(run, status)
                for rs in state.rank_list():
                    if rs.pid is not None and rs.host in ("", self.here):
                        owners[rs.pid] = RankOwner(run.id, rs.rank)
                    live_ranks.append((run.id, rs))
                for host, gpus in state.gpus.items():
                    if gpus and host not in ("", self.here) and host not in host_gpus:  # the newest run's sample wins
                        on_host = {rs.pid: RankOwner(run.id, rs.rank) for rs in state.rank_list()
                                   if rs.host == host and rs.pid is not None}
                        host_gpus[host] = HostGpus(host, run.id, gpus_as_shown(gpus), MappingProxyType(on_host))
            else:
                self._live.pop(run.id, None)
                summary = self._summary(run)
            rows.append(RunRow(summary, run.path, live))
        shown_gpus = tuple(host_gpus[host] for host in sorted(host_gpus))
        key = (tuple(rows), tuple(owners.items()), shown_gpus, tuple((i, id(r)) for i, r in live_ranks))
        if key == self._last:
            return None
        self._last = key
        self._serial += 1
        return RunsSnapshot(
            rows=tuple(rows),
            owners=MappingProxyType(owners),
            host_gpus=shown_gpus,
            live_ranks=tuple(live_ranks),
            presets=self._presets,
            serial=self._serial,
        )

    def _follow(self, run: RunDirectory, status: RunStatus) -> tuple[RunSummary, RunState]:
        """A live run read on from where the last poll left it; summarised again only when it changed."""
        followed = self._live.get(run.id)
        if followed is None:
            followed = self._live[run.id] = _LiveRun(RunFollower(run))
        followed.follower.poll(status)
        model = followed.follower.model()
        if followed.summary is None or model is not followed.model:
            followed.model, followed.summary = model, summarize(run, model)
        return followed.summary, model.state

    def _summary(self, run: RunDirectory) -> RunSummary:
        signature = _signature(run)
        cached = self._summaries.get(run.id)
        if cached is not None and cached[0] == signature:
            return cached[1]
        summary = summarize(run)
        self._summaries[run.id] = (signature, summary)
        return summary


def _signature(run: RunDirectory) -> tuple[object, ...]:
    """Changes when a finished run's summary could: its event files or its exit record."""
    sizes = []
    for path in sorted(run.events_dir.glob("rank-*.jsonl")) if run.events_dir.is_dir() else []:
        try:
            sizes.append((path.name, path.stat().st_size))
        except OSError:
            continue
    try:
        exit_mtime = run.exit_path.stat().st_mtime
    except OSError:
        exit_mtime = None
    return (tuple(sizes), exit_mtime)
