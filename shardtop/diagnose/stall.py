"""``rank-stalled``: a rank stopped moving while the others went on (``stalls.py`` tells which).

The likeliest cause is a collective that not every rank entered: the stalled
rank waits in it for a peer that skipped it, took another branch, or left
its loop early.  The finding names the rank, its phase and step, how long it
has been still against its usual step, what the others are doing, and its
GPU's utilisation where NVML read it (a GPU busy at 100 % with no progress is
NCCL spinning in a collective).
"""

from __future__ import annotations

from dataclasses import dataclass

from shardtop.diagnose.finding import Evidence, Explanation, Rule
from shardtop.read.run_model import RunModel
from shardtop.read.stalls import Peer, Stall


@dataclass(frozen=True)
class Stalled(Evidence):
    stall: Stall
    stalled_ranks: tuple[int, ...]
    gpu_util: int | None
    """Utilisation (%) of the stalled rank's GPU in the latest NVML sample, where there is one."""


def _gpu_util(m: RunModel, rank: int) -> int | None:
    r = m.rank(rank)
    gpu = m.gpu_of(r) if r is not None else None
    return gpu.util if gpu is not None else None


def find_stalled(m: RunModel) -> Stalled | None:
    stalls = m.stalls
    if not stalls:
        return None
    first = min(stalls.values(), key=lambda s: (s.step, s.rank))
    return Stalled(stall=first, stalled_ranks=tuple(sorted(stalls)), gpu_util=_gpu_util(m, first.rank))


def _peer_words(p: Peer) -> str:
    return f"rank {p.rank} {'has ended' if p.ended else f'is at step {p.step} ({p.phase})'}"


def explain_stalled(e: Stalled) -> Explanation:
    s = e.stall
    others = ", ".join(_peer_words(p) for p in s.peers[:4]) + (" …" if len(s.peers) > 4 else "")
    also = [r for r in e.stalled_ranks if r != s.rank]
    more = f" Ranks {', '.join(map(str, also))} are stalled too." if also else ""
    gpu = f" Its GPU reads {e.gpu_util} % busy." if e.gpu_util is not None else ""
    if s.between_steps:
        return _between_steps(s, others, more, gpu)
    return Explanation(
        title=f"Rank {s.rank} has made no progress for {s.idle_s:.0f} s, in {s.phase or 'its phase'} of step {s.step}",
        detail=(
            f"Rank {s.rank} last moved {s.idle_s:.0f} s ago, {s.idle_s / s.usual_step_s:.0f} times its usual step "
            f"({s.usual_step_s:.2f} s), and is still in {s.phase or 'its phase'} of step {s.step}, while {others}."
            f"{more}{gpu} Most likely it waits in a collective (an all-reduce, a barrier, a broadcast) that the "
            "others did not enter: a branch only some ranks take, a different number of batches per rank, or a "
            "rank that left its loop early."
        ),
        fix=(
            "Make every rank call the same collectives in the same order: no collective under a condition that "
            "differs between ranks, the same number of batches on each rank (drop_last, or a sampler that pads), "
            "and the same early stopping decision, agreed on by all ranks."
        ),
        severity="warning",
    )


def _between_steps(s: Stall, others: str, more: str, gpu: str) -> Explanation:
    """A rank that finished its step and began no other: busy with work of its own as often as waiting."""
    return Explanation(
        title=f"Rank {s.rank} has begun no step for {s.idle_s:.0f} s since it finished step {s.step}",
        detail=(
            f"Rank {s.rank} finished step {s.step} {s.idle_s:.0f} s ago, {s.idle_s / s.usual_step_s:.0f} times its "
            f"usual step ({s.usual_step_s:.2f} s), and has begun no other, while {others}.{more}{gpu} Between "
            "steps it runs code of its own (a save of the model, an evaluation, logging), and the others wait for "
            "it at their next collective; or it waits in a collective the others did not enter (a barrier under a "
            "condition only it meets). Which of the two, nothing here shows."
        ),
        fix=(
            "Nothing, if it is saving or evaluating: it goes on when that ends. If it never does, look for a "
            "collective called between steps by some ranks only, and make every rank call it."
        ),
        severity="info",
    )


STALLED: Rule[Stalled] = Rule("rank-stalled", find_stalled, explain_stalled)
