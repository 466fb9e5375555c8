"""ZeRO-3's persistence threshold: parameters of at most ``stage3_param_persistence_threshold``
elements (1e5 by default) are kept whole on every rank from the first forward on, so a model
made of many small layers is barely sharded at all.

The probe reads those parameters as ``persistent``, held whole beside their partition (``Shards.info``:
``persistent_params``, ``persistent_bytes``, ``persistence_threshold``).
"""

from __future__ import annotations

from dataclasses import dataclass

from shardtop.diagnose.facts import Driver, driver_of, fmt
from shardtop.diagnose.finding import Evidence, Explanation, Rule
from shardtop.read.run_model import RunModel
from shardtop.read.tree_facts import covering_rows
from shardtop.rundir.engines import ZERO3
from shardtop.rundir.events import Shards
from shardtop.words import list_names

PERSISTENT_MIN_SHARE = 0.1
"""Persistent parameters are worth a finding from a tenth of the model up: by default they are
the biases and norms of a large model, well under 1 %."""

PERSISTENT_MIN_BYTES = 4 << 20
"""...and when sharding them would free at least 4 MiB per rank."""


@dataclass(frozen=True)
class Persistent(Evidence):
    world_size: int
    data_parallel_size: int
    threshold: int | None
    """``stage3_param_persistence_threshold`` as the engine read it (None: not recorded)."""
    persistent_params: int
    params: int
    """Parameter tensors ZeRO-3 manages."""
    persistent_bytes: int
    model_bytes: int
    modules: tuple[str, ...]
    """The outermost modules whose parameters are all persistent."""
    driver: Driver

    @property
    def freed_bytes(self) -> int:
        """A rank holds a persistent parameter whole beside its partition: below the threshold, the
        partition alone."""
        return self.persistent_bytes


def find_persistent(m: RunModel) -> Persistent | None:
    if m.engine != ZERO3 or not m.full_bytes or m.tree is None:
        return None
    r = next((r for r in m.engine_ranks if m.aligned(r.shards)), None)
    if r is None or r.shards is None:
        return None
    s = r.shards
    kept = s.info.get("persistent_bytes")
    dp = s.info.get("data_parallel_size")
    if not isinstance(kept, int) or not isinstance(dp, int) or dp < 2 or kept < PERSISTENT_MIN_SHARE * m.full_bytes:
        return None
    found = Persistent(
        world_size=m.world_size,
        data_parallel_size=dp,
        threshold=_int(s.info.get("persistence_threshold")),
        persistent_params=_int(s.info.get("persistent_params")) or 0,
        params=sum(u.params for u in s.units if u.kind == ZERO3),
        persistent_bytes=kept,
        model_bytes=m.full_bytes,
        modules=_persistent_modules(m, r.shards),
        driver=driver_of(m),
    )
    return found if found.freed_bytes >= PERSISTENT_MIN_BYTES else None


def _int(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _persistent_modules(m: RunModel, s: Shards) -> tuple[str, ...]:
    assert m.tree is not None
    persistent = s.states.index("persistent") if "persistent" in s.states else -2
    selected = [st == persistent for st in s.state]
    rows = covering_rows(selected, [b > 0 for b in m.tree.bytes], m.tree.parents)
    return tuple(m.path(row) for row in rows)


def explain_persistent(e: Persistent) -> Explanation:
    n = e.data_parallel_size
    share = e.persistent_bytes / e.model_bytes
    threshold = f"{e.threshold:,}" if e.threshold is not None else "its"
    detail = (
        f"{e.persistent_params} of the {e.params} parameter tensors ZeRO-3 manages are at most "
        f"{threshold} elements, ZeRO-3's stage3_param_persistence_threshold: it keeps them whole on every rank "
        f"from the first forward on, to spare an all-gather per use. Together they are {fmt(e.persistent_bytes)}, "
        f"{share:.0%} of the model's {fmt(e.model_bytes)}, held in full by each of the {n} ranks beside its 1/{n} "
        "partition"
        + (f" ({list_names(e.modules)})." if e.modules and e.modules != ("",) else ".")
    )
    setting = '"zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0, ...}'
    if e.driver == "lightning":
        where = f"`DeepSpeedStrategy(config={{{setting}}})` (the strategy has no argument for it)"
    else:
        where = f"the DeepSpeed config: `{setting}`"
    fix = (
        f"Lower the threshold below the size of the tensors that should be sharded, or to 0, in {where}. Those "
        "tensors are then all-gathered for every forward and backward like the rest: more, smaller collectives."
    )
    return Explanation(
        title=f"ZeRO-3 keeps {fmt(e.persistent_bytes)} ({share:.0%} of the model) whole on every rank: "
        "its tensors are under the persistence threshold",
        detail=detail,
        fix=fix,
        severity="warning",
        saving_bytes=e.freed_bytes,
        modules=e.modules,
    )


PERSISTENT = Rule("zero3-persistence-threshold", find_persistent, explain_persistent)
