"""Every rank of a host loads the whole model into host memory before the engine shards it (or
moves it to its GPU): N copies must fit in the host's RAM at once, or in the job's cgroup limit.

Weighed from each rank's set-up snapshot (what it held whole on the CPU), the host memory and
cgroup limit each rank reported (``Hello.host_memory``/``host_memory_limit``) and the ranks'
resident memory samples.

Not for a rehearsal: its ranks ran one after another, so their copies never shared the host's
memory, and how many ranks of the job share a host is not known from it.  What a rehearsed rank
built whole is said by the rules about the engine (``zero3-not-partitioned-at-init``).
"""

from __future__ import annotations

from dataclasses import dataclass

from shardtop.diagnose.facts import ENGINE_WORDS, Driver, OomEvidence, driver_of, fmt
from shardtop.diagnose.finding import Evidence, Explanation, Rule, Severity
from shardtop.read.oom_story import OomStory
from shardtop.read.rank_facts import RankFacts
from shardtop.read.run_model import RunModel
from shardtop.rundir.engines import FSDP1, FSDP2, FSDP_ENGINES, SHARDED_ENGINES, ZERO3
from shardtop.rundir.events import Shards

WHOLE_SHARE = 0.9
"""A rank "holds the whole model" from 90 % of its parameter bytes up (a head built later, say)."""

HOST_MIN_SHARE = 0.25
"""The copies are worth a finding from a quarter of the host memory up; an OOM in host memory
at set-up makes it an error, but is not enough alone (a per-process limit may explain it)."""

HOST_WARN_SHARE = 0.5
"""From half of it, another process or a second copy during a conversion leaves little room."""

HELD_WHOLE_STATES = frozenset({"unsharded", "replicated"})

ENGINES_THAT_NEED_NO_COPY = SHARDED_ENGINES
"""Engines whose ranks need only their shard: the whole model on every rank is avoidable."""


@dataclass(frozen=True)
class WholeOnHost(Evidence):
    host: str
    ranks: int
    """Ranks of the host that held the whole model in host memory at set-up (all of the host's)."""
    model_bytes: int
    held_bytes: int
    """Parameter bytes those ranks held on the CPU at set-up, summed."""
    host_memory: int
    memory_limit: int | None
    """The ranks' cgroup limit, where lower than the host's memory."""
    peak_rss: int
    """Those ranks' highest resident memory, summed (0: not sampled)."""
    engine: str
    on_gpus: bool
    driver: Driver
    oom: OomEvidence | None
    """A rank of this host that ran out of host memory during set-up."""

    @property
    def available(self) -> int:
        return min(self.host_memory, self.memory_limit or self.host_memory)

    @property
    def share(self) -> float:
        return self.held_bytes / max(self.available, 1)


def _cpu_whole_bytes(m: RunModel, setup: Shards | None) -> int:
    if setup is None or not m.aligned(setup):
        return 0
    return sum(
        b
        for b, d, st in zip(setup.bytes, setup.device, setup.state, strict=True)
        if 0 <= d < len(setup.devices) and setup.devices[d] == "cpu"
        and 0 <= st < len(setup.states) and setup.states[st] in HELD_WHOLE_STATES
    )


def _host_oom(m: RunModel, host: str) -> OomStory | None:
    return next((s for s in m.ooms if s.oom.host == host and s.oom.phase == "setup" and s.oom.device == "cpu"), None)


def find_whole_on_host(m: RunModel) -> WholeOnHost | None:
    if m.rehearsal is not None:
        return None
    on_gpus = any(r.device.startswith("cuda") for r in m.ranks)
    if not m.full_bytes or (m.engine not in ENGINES_THAT_NEED_NO_COPY and not on_gpus):
        return None  # on CPU processes DDP or a plain model needs the whole model in each rank anyway
    found: list[WholeOnHost] = []
    for host in m.hosts:
        ranks = [r for r in m.ranks if r.host == host]
        held = [_cpu_whole_bytes(m, r.setup) for r in ranks]
        if len(ranks) < 2 or any(h < WHOLE_SHARE * m.full_bytes for h in held):
            continue
        memory = _reported(ranks, "host_memory")
        if memory is None:
            continue
        story = _host_oom(m, host)
        evidence = WholeOnHost(
            host=host,
            ranks=len(ranks),
            model_bytes=m.full_bytes,
            held_bytes=sum(held),
            host_memory=memory,
            memory_limit=_reported(ranks, "host_memory_limit"),
            peak_rss=sum(r.state.peak_host_rss for r in ranks),
            engine=m.engine,
            on_gpus=on_gpus,
            driver=driver_of(m),
            oom=OomEvidence.of(story, len(m.ooms)) if story is not None else None,
        )
        if evidence.share >= HOST_MIN_SHARE:  # an OOM alone does not say the copies filled the host
            found.append(evidence)
    return max(found, key=lambda e: (e.oom is not None, e.share)) if found else None


def _reported(ranks: list[RankFacts], field: str) -> int | None:
    values = [v for r in ranks if r.hello is not None and isinstance(v := getattr(r.hello, field), int) and v > 0]
    return min(values) if values else None


def _fix(e: WholeOnHost) -> str:
    if e.engine == ZERO3:
        if e.driver == "lightning":
            return (
                "Build the layers in configure_model(): Lightning calls it inside deepspeed.zero.Init, "
                "so each rank only ever materialises its partition."
            )
        return (
            "Build the model under `with deepspeed.zero.Init(config_dict_or_path=ds_config):`: "
            "each rank only ever materialises its partition."
        )
    if e.driver == "lightning" and e.engine in FSDP_ENGINES:
        return (
            "Build the layers in configure_model() instead of __init__: Lightning's FSDP strategies create them "
            "on the meta device there and materialise each rank's shard only, after sharding."
        )
    if e.engine == FSDP2:
        return (
            'Build the model on the meta device (`with torch.device("meta"): model = Net()`), call fully_shard, '
            "then `model.to_empty(device=...)` and initialise or load the weights shard by shard "
            "(torch.distributed.checkpoint, or `set_model_state_dict` with `broadcast_from_rank0=True` from a "
            "checkpoint loaded on rank 0 only)."
        )
    if e.engine == FSDP1:
        return (
            'Build the model on the meta device on every rank but rank 0 (`with torch.device("meta"):`) and pass '
            "`sync_module_states=True, param_init_fn=lambda m: m.to_empty(device=device, recurse=False)` to FSDP: "
            "rank 0's weights are broadcast as each unit is sharded."
        )
    return (
        'Build the model on its GPU directly (`with torch.device("cuda", local_rank):`) instead of on the CPU, and '
        "load checkpoints with `torch.load(path, mmap=True)`, so the ranks of a host share one copy of the file "
        "in the page cache; or shard the model (FSDP, ZeRO-3) and build it on the meta device."
    )


def explain_whole_on_host(e: WholeOnHost) -> Explanation:
    engine = ENGINE_WORDS.get(e.engine, e.engine or "the engine")
    room = (
        f"the {fmt(e.available)} this job may use (its cgroup's limit; the host has {fmt(e.host_memory)})"
        if e.memory_limit
        else f"the host's {fmt(e.host_memory)}"
    )
    detail = (
        f"Each of the {e.ranks} ranks on {e.host} held the whole model ({fmt(e.model_bytes)}) in host memory at "
        f"set-up: {fmt(e.held_bytes)} together, {e.share:.0%} of {room}."
    )
    if e.peak_rss:
        detail += f" Their processes reached {fmt(e.peak_rss)} resident together."
    if e.engine in ENGINES_THAT_NEED_NO_COPY:
        detail += f" Under {engine} each rank only keeps its shard: the whole copies exist only until it shards them."
    elif e.on_gpus:
        detail += " Each rank needs the model on its GPU; the copy in host memory is only a way there."
    if e.oom is not None:
        detail += f" Rank {e.oom.rank} ran out of host memory during set-up" + (
            f", in {e.oom.engine_step}." if e.oom.engine_step else "."
        )
    severity: Severity = "error" if e.oom is not None else "warning" if e.share >= HOST_WARN_SHARE else "info"
    n = e.ranks
    return Explanation(
        title=f"Every rank on {e.host} loads the whole model into host memory: {n} × {fmt(e.model_bytes)} = "
        f"{e.share:.0%} of {fmt(e.available)}",
        detail=detail,
        fix=_fix(e),
        severity=severity,
        saving_bytes=e.model_bytes * (n - 1) // n,
    )


WHOLE_ON_HOST = Rule("host-memory-whole-model-per-rank", find_whole_on_host, explain_whole_on_host)
