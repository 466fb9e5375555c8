"""``memory-grows-every-step``: a rank's memory climbs by about the same amount every step.

Tensors kept across steps (a list of each step's logits, a forward hook that
appends activations, a metric that holds its inputs) are among the commonest
causes of "out of memory after N steps".  The rule reads each rank's memory at
the start of every forward (``memory_growth.py`` fits it, warm-up and plateaus
left out) and, where the probe traced a step, what was still alive from it:
which module made it, its shape and dtype.  It says the rate, the steps it was
seen over, and the step (and time) at which the rank reaches its limit.
"""

from __future__ import annotations

from dataclasses import dataclass

from shardtop.diagnose.finding import Evidence, Explanation, Rule
from shardtop.read.memory_growth import Growth
from shardtop.read.run_model import RunModel
from shardtop.rundir.events import KeptTensor
from shardtop.units import format_bytes
from shardtop.words import plural

KEPT_SHARE = 0.5
"""Kept tensors are named as the cause when they make up at least half of the rise per step."""


@dataclass(frozen=True)
class KeptRow:
    """Tensors of one shape and dtype that one module made and that outlived their step."""

    module: str
    module_type: str
    shape: tuple[int, ...]
    dtype: str
    bytes: int
    count: int

    @classmethod
    def of(cls, t: KeptTensor) -> KeptRow:
        return cls(t.module, t.module_type, tuple(t.shape), t.dtype, t.bytes, t.count)


@dataclass(frozen=True)
class Growing(Evidence):
    rank: int
    ranks: tuple[int, ...]
    """Every rank whose memory grows."""
    growth: Growth
    measured_by: str
    """``allocated`` (GPU), ``C allocator`` (CPU, glibc) or ``host RSS``."""
    kept: tuple[KeptRow, ...]
    """What the traced step left alive, largest first (empty: no trace, or nothing kept)."""
    kept_bytes: int
    kept_step: int | None
    """The step traced (None: not traced)."""
    limit_words: str

    @property
    def kept_explains(self) -> bool:
        return bool(self.kept) and self.kept_bytes >= KEPT_SHARE * self.growth.rate


def _measured_by(m: RunModel, rank: int) -> str:
    r = m.rank(rank)
    memory = r.memory if r is not None else None
    if memory is not None and memory.allocated is not None:
        return "allocated"
    if memory is not None and memory.host_heap is not None:
        return "C allocator"
    return "host RSS"


def _limit_words(m: RunModel, rank: int) -> str:
    r = m.rank(rank)
    if r is None:
        return ""
    memory = r.memory
    if memory is not None and memory.limit:
        # the run's gpu_mem_limit, or a cap the script set itself (set_per_process_memory_fraction)
        return "its memory cap (gpu_mem_limit)" if m.meta.config.gpu_mem_limit == memory.limit else "its memory cap"
    return f"the memory of {r.device}" if r.device.startswith("cuda") else "the host's memory"


def find_growing(m: RunModel) -> Growing | None:
    grown = m.growth
    if not grown:
        return None
    rank = max(grown, key=lambda k: grown[k].rate)
    r = m.rank(rank)
    kept = r.state.kept if r is not None else None
    return Growing(
        rank=rank,
        ranks=tuple(sorted(grown)),
        growth=grown[rank],
        measured_by=_measured_by(m, rank),
        kept=tuple(KeptRow.of(t) for t in kept.tensors) if kept is not None else (),
        kept_bytes=kept.bytes if kept is not None else 0,
        kept_step=kept.step if kept is not None else None,
        limit_words=_limit_words(m, rank),
    )


def _tensor_words(t: KeptRow) -> str:
    where = f"`{t.module}` ({t.module_type})" if t.module else f"the model's output ({t.module_type})"
    shape = "×".join(str(n) for n in t.shape) or "scalar"
    count = f"{t.count} tensors" if t.count != 1 else "a tensor"
    return f"{count} of {shape} {t.dtype} made by {where}, {format_bytes(t.bytes)}"


def explain_growing(e: Growing) -> Explanation:
    g = e.growth
    others = [r for r in e.ranks if r != e.rank]
    also = f" ({plural(len(others), 'other rank')} grow too: {', '.join(map(str, others))})" if others else ""
    rise = (
        f"Rank {e.rank}'s memory ({e.measured_by}) at the start of each forward rose "
        f"{format_bytes(round(g.rate))} a step from step {g.first_step} to step {g.last_step} "
        f"({format_bytes(g.first_bytes)} to {format_bytes(g.last_bytes)}){also}."
    )
    parts = [rise]
    if e.kept_explains:
        listed = "; ".join(_tensor_words(t) for t in e.kept[:3])
        parts.append(
            f"Of what step {e.kept_step}'s forward made, {format_bytes(e.kept_bytes)} was still alive two steps "
            f"later: {listed}. Something keeps a reference to it every step: a list it is appended to, a hook, "
            "a metric or a log that stores the tensor rather than a number."
        )
    elif e.kept_step is not None:
        parts.append(
            f"The probe traced step {e.kept_step}: what its forward made was not kept "
            f"({format_bytes(e.kept_bytes)} still alive), so the growth comes from elsewhere (data, the optimizer, "
            "a cache of the script's own)."
        )
    when = g.out_of_memory_step
    if when is not None:
        seconds = g.seconds_left
        later = f", about {_duration(seconds)} from the last step seen" if seconds is not None else ""
        parts.append(f"At this rate it reaches {e.limit_words} ({format_bytes(g.limit or 0)}) "
                     f"at about step {when}{later}.")
    fix = (
        "Keep numbers, not tensors: append `loss.item()` or `out.detach().cpu()` of what you need, or clear the "
        "list each step; a forward hook that stores activations should store a copy only when asked, and be "
        "removed when done."
        if e.kept_explains
        else "Find what holds on to memory between steps: tensors appended to lists, caches keyed by step, "
        "hooks that store their inputs or outputs."
    )
    return Explanation(
        title=f"Memory grows {format_bytes(round(g.rate))} every step on rank {e.rank}",
        detail=" ".join(parts),
        fix=fix,
        severity="warning",
        modules=tuple(t.module for t in e.kept[:3] if t.module) if e.kept_explains else (),
    )


def _duration(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


GROWING: Rule[Growing] = Rule("memory-grows-every-step", find_growing, explain_growing)
