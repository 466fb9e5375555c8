"""The read model: every fact a view or a rule asks about a run, derived once.

``RunModel.of(state, meta, status)`` wraps a folded ``RunState`` (events),
the parsed ``run.json`` and the run's status, and answers: the engine (one
precedence), the OOMs (earliest first, ties to the lowest rank) told as
``OomStory``s, each rank's holdings and status, the run's status in words,
the one-line summary, the plan set against what the ranks measured, and the
samples rank-to-rank comparisons may use (all ranks alive, same step and
phase: ``rank_memory.py``).  The TUI, the report in every format,
``shardtop runs``, the headless follower and the diagnosis render it; none
works a fact out again.  Pure Python: no torch, no textual, no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from functools import cached_property
from types import MappingProxyType

from shardtop.read.memory_growth import Growth
from shardtop.read.oom_story import OomStory, user_type
from shardtop.read.plan_check import PlanCheck, check_plan
from shardtop.read.rank_facts import RankFacts, RankStatus, rank_facts
from shardtop.read.rank_memory import (
    ComparableMemory,
    growth_by_rank,
    rank_gpu,
    rank_memory_limit,
    same_step_gpus,
    same_step_memory,
)
from shardtop.read.run_state import TRAINING_PHASES, GpuSample, RunState
from shardtop.read.shard_model import subtree_sums
from shardtop.read.stalls import Stall, find_stalls
from shardtop.read.tree_facts import Block, find_block
from shardtop.rundir.events import Fault, Scalar, Shards, Tree
from shardtop.rundir.memory_figures import GpuMemory
from shardtop.rundir.run_config import RehearsalConfig
from shardtop.rundir.run_meta import RunMeta
from shardtop.rundir.run_status import RunStatus


@dataclass(frozen=True)
class RunModel:
    """A run as every view sees it."""

    state: RunState
    meta: RunMeta = field(default_factory=RunMeta)
    status: RunStatus | None = None
    """The run's status from its directory (None: events alone, no directory read)."""
    log_tails: Mapping[str, tuple[str, ...]] = field(default_factory=lambda: MappingProxyType({}))
    """The last lines of each of the run's logs (by its path in the run directory), read only when the ranks
    recorded nothing."""

    @classmethod
    def of(
        cls,
        state: RunState,
        meta: RunMeta | None = None,
        status: RunStatus | None = None,
        log_tails: Mapping[str, tuple[str, ...]] | None = None,
    ) -> RunModel:
        return cls(state, meta or RunMeta(), status, MappingProxyType(dict(log_tails or {})))

    # -- ranks ------------------------------------------------------------------------------

    @property
    def running(self) -> bool | None:
        return None if self.status is None else self.status.state == "running"

    @cached_property
    def ranks(self) -> tuple[RankFacts, ...]:
        stalls = self.stalls
        return tuple(
            replace(f, status=RankStatus("stalled", stalls[f.rank].words)) if f.rank in stalls else f
            for f in self._recorded_ranks
        )

    @cached_property
    def _recorded_ranks(self) -> tuple[RankFacts, ...]:
        """Each rank as its own records and its supervisor's tell it."""
        return tuple(rank_facts(rs, self.status) for rs in self.state.rank_list())

    @cached_property
    def stalls(self) -> Mapping[int, Stall]:
        """The running ranks that stopped moving while others moved on (``stalls.py``); none in a
        rehearsal, whose ranks run one after another (the others ended or are still to come) and whose
        collectives wait for no peer."""
        running = {f.rank: f.status.state == "running" for f in self._recorded_ranks}
        if self.rehearsal is not None or not any(running.values()):
            return MappingProxyType({})
        return MappingProxyType(find_stalls((f.state for f in self._recorded_ranks), running, self.state.last_t))

    def rank(self, rank: int) -> RankFacts | None:
        return next((r for r in self.ranks if r.rank == rank), None)

    @property
    def world_size(self) -> int:
        for r in self.ranks:
            if r.hello is not None:
                return r.hello.world_size
        return self.meta.config.world_size or len(self.ranks)

    @property
    def rehearsal(self) -> RehearsalConfig | None:
        """The ranks of a larger job this run rehearses, one at a time on one device; None for a real run."""
        return self.meta.config.rehearsal

    @property
    def expected_ranks(self) -> tuple[int, ...]:
        """The ranks this run runs: every rank of the job, or the rehearsed ones."""
        if self.rehearsal is not None:
            return self.rehearsal.ranks
        return tuple(range(self.world_size))

    @property
    def missing_ranks(self) -> tuple[int, ...]:
        """Ranks the run should have that never wrote an event."""
        seen = {r.rank for r in self.ranks}
        return tuple(r for r in self.expected_ranks if r not in seen)

    @cached_property
    def hosts(self) -> tuple[str, ...]:
        return tuple(sorted({r.host for r in self.ranks if r.host}))

    @cached_property
    def ranks_by_host(self) -> Mapping[str, tuple[int, ...]]:
        """Each host and the ranks that ran on it, in rank order (a job over several hosts)."""
        hosts: dict[str, list[int]] = {}
        for r in sorted(self.ranks, key=lambda r: r.rank):
            if r.host:
                hosts.setdefault(r.host, []).append(r.rank)
        return MappingProxyType({host: tuple(ranks) for host, ranks in sorted(hosts.items())})

    @cached_property
    def slurm_steps(self) -> tuple[tuple[str, str], ...]:
        """SLURM (job id, step id) of the run: as its ranks said, else as ``run.json`` recorded it."""
        steps = {(h.slurm_job_id, h.slurm_step_id) for r in self.ranks if (h := r.hello) is not None and h.slurm_job_id}
        slurm = self.meta.slurm
        if not steps and slurm is not None and slurm.job_id:
            steps = {(slurm.job_id, slurm.step_id)}
        return tuple(sorted(steps))

    @property
    def step(self) -> int:
        return max((r.state.step for r in self.ranks), default=0)

    @property
    def engine_ranks(self) -> list[RankFacts]:
        """Ranks with a snapshot taken after the engine wrapped the model."""
        return [r for r in self.ranks if r.shards is not None]

    def first_engine_rank(self) -> RankFacts | None:
        ranks = self.engine_ranks
        return ranks[0] if ranks else None

    # -- the engine -------------------------------------------------------------------------

    @cached_property
    def engine(self) -> str:
        """How the ranks hold the model: the lowest rank's engine snapshot, else what the ranks
        announced, else a set-up snapshot (which reads ``plain``: nothing is wrapped yet)."""
        for r in self.ranks:
            if r.shards is not None and r.shards.engine:
                return r.shards.engine
        for r in self.ranks:
            if r.hello is not None and r.hello.engine:
                return r.hello.engine
        for r in self.ranks:
            if r.setup is not None and r.setup.engine:
                return r.setup.engine
        return ""

    @property
    def held_as(self) -> str:
        """Where the shards in hand still read otherwise than the engine: ``plain at setup`` (story 2)."""
        r = self.ranks[0] if self.ranks else None
        if r is None or r.shards is not None or r.setup is None or r.setup.engine in ("", self.engine):
            return ""
        return f"{r.setup.engine} at setup"

    @cached_property
    def strategy(self) -> str:
        return next((r.hello.strategy for r in self.ranks if r.hello is not None and r.hello.strategy), "")

    @cached_property
    def program(self) -> str:
        return next((r.hello.program for r in self.ranks if r.hello is not None and r.hello.program), "") or (
            self.meta.config.program
        )

    @cached_property
    def versions(self) -> Mapping[str, str]:
        for r in self.ranks:
            if r.hello is not None and r.hello.versions:
                return MappingProxyType(dict(r.hello.versions))
        return MappingProxyType({})

    @cached_property
    def info(self) -> Mapping[str, Scalar]:
        """Engine-wide facts from the lowest rank's best snapshot (set-up facts under them)."""
        merged: dict[str, Scalar] = {}
        for r in reversed(self.ranks):
            if r.setup is not None:
                merged.update(r.setup.info)
        for r in reversed(self.ranks):
            if r.shards is not None:
                merged.update(r.shards.info)
        return MappingProxyType(merged)

    @property
    def driver(self) -> str:
        return str(self.info.get("driver") or "")

    @property
    def lightning(self) -> bool:
        """Driven through a Lightning Trainer (the fix is then said in Lightning's words)."""
        if self.driver:
            return self.driver.startswith("Lightning")
        return self.strategy.endswith("Strategy")

    # -- the model --------------------------------------------------------------------------

    @property
    def tree(self) -> Tree | None:
        return self.state.tree

    @property
    def paths(self) -> tuple[str, ...]:
        return self.state.paths

    def path(self, row: int) -> str:
        return self.paths[row] if 0 <= row < len(self.paths) else ""

    @cached_property
    def row_of_path(self) -> Mapping[str, int]:
        return MappingProxyType({p: i for i, p in enumerate(self.paths)})

    def type_of(self, row: int) -> str:
        tree = self.tree
        return tree.type_names[tree.types[row]] if tree is not None and 0 <= row < len(tree.types) else ""

    @cached_property
    def subtree_bytes(self) -> list[int]:
        tree = self.tree
        return subtree_sums(tree.bytes, tree.parents) if tree is not None else []

    @property
    def full_bytes(self) -> int:
        """Bytes of every parameter at full size (the whole model, once)."""
        return self.subtree_bytes[0] if self.subtree_bytes else 0

    @property
    def full_params(self) -> int:
        return sum(self.tree.params) if self.tree is not None else 0

    @cached_property
    def block(self) -> Block | None:
        if self.tree is None or not self.paths:
            return None
        return find_block(self.tree, self.paths, self.subtree_bytes)

    def aligned(self, shards: Shards | None) -> bool:
        """Do ``shards``' arrays line up with the current tree?"""
        tree = self.tree
        return (
            shards is not None
            and tree is not None
            and shards.tree_id == tree.tree_id
            and len(shards.bytes) == len(tree.names)
        )

    # -- OOMs -------------------------------------------------------------------------------

    @cached_property
    def ooms(self) -> tuple[OomStory, ...]:
        """Every rank's OOM, the earliest first (ties: the lowest rank first)."""
        found = sorted((r.oom for r in self.ranks if r.oom is not None), key=lambda o: (o.t, o.rank))
        known = self.tree.type_names if self.tree is not None else ()
        return tuple(OomStory(o, user_type(o.module_type, self._tree_type(o.module), known)) for o in found)

    @property
    def first_oom(self) -> OomStory | None:
        return self.ooms[0] if self.ooms else None

    def _tree_type(self, path: str | None) -> str | None:
        row = self.row_of_path.get(path) if path is not None else None
        return self.type_of(row) if row is not None else None

    # -- the plan ---------------------------------------------------------------------------

    @cached_property
    def plan_check(self) -> PlanCheck | None:
        """The plan the run wrote at set-up, set against what each rank measured (None: no plan written)."""
        plan = self.state.plan
        return None if plan is None else check_plan(plan, self.ranks, self.engine)

    # -- status -----------------------------------------------------------------------------

    @property
    def status_text(self) -> str:
        """The run's status, told from the ranks' own exits when no launcher recorded one.

        A script run with ``ShardtopCallback`` or ``shardtop.probe`` has no
        supervisor to write ``exit.json``: once its processes are gone it would
        read ``lost``, although every rank said how it left.
        """
        if self.status is None:
            return "not known"
        described = self.status.describe()
        if self.status.state != "lost" or not self.ranks or any(r.exit is None for r in self.ranks):
            return described
        ok = all(r.status.state == "finished" for r in self.ranks)
        return f"{'finished' if ok else 'failed'} (every rank reported its exit; no launcher recorded one)"

    @property
    def recorded_nothing(self) -> bool:
        return self.state.events == 0

    @property
    def summary_note(self) -> str:
        """One line for ``shardtop runs`` and the run list: the first OOM, or what went wrong reading it."""
        first = self.first_oom
        if first is not None:
            return first.short
        if self.state.inconsistent:
            return f"{self.state.inconsistent} inconsistent event(s) left out"
        if self.state.skipped:
            return f"{self.state.skipped} unreadable event line(s)"
        if self.recorded_nothing and self.status is not None and self.status.state != "running":
            return "no events recorded"
        return ""

    # -- over time ---------------------------------------------------------------------------

    @cached_property
    def growth(self) -> Mapping[int, Growth]:
        """Each rank whose memory climbs steadily from step to step, and where it leads."""
        return growth_by_rank(self.ranks, self.state.gpus)

    def gpu_of(self, r: RankFacts) -> GpuMemory | None:
        """The NVML reading of the GPU a rank was given, from its node's latest sample."""
        return rank_gpu(r, self.state.gpus)

    def memory_limit_of(self, r: RankFacts) -> int | None:
        """What the rank may use before it runs out: its cap, else its GPU's memory (NVML), else, on CPU,
        the host's memory limit or memory."""
        return rank_memory_limit(r, self.state.gpus)

    # -- like-with-like samples -------------------------------------------------------------

    @cached_property
    def comparable_memory(self) -> ComparableMemory | None:
        """Every rank's allocator sample from the latest step and phase that all of them reached
        alive (``rank_memory.same_step_memory``); None for a rehearsal."""
        return same_step_memory(self.ranks, self.world_size, self.rehearsal)

    def comparable_gpus(self, host: str) -> GpuSample | None:
        """The latest NVML sample of ``host`` taken while every rank there was up and training
        (``rank_memory.same_step_gpus``); None for a rehearsal."""
        return same_step_gpus(self.ranks, self.state.gpu_samples, host, self.rehearsal)

    @property
    def faults(self) -> tuple[Fault, ...]:
        """Every part of the probe that failed, on every rank, in rank order."""
        return tuple(f for r in self.ranks for f in r.state.faults)

    @property
    def training(self) -> bool:
        """Some rank is (or was) past set-up."""
        return any(r.state.phase in TRAINING_PHASES or r.state.step > 0 for r in self.ranks)

