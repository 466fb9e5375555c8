"""``FRAGMENTATION`` (``shardtop/plan/cards.py``): the share of a capped allocator's limit that a plan keeps
back for rounding and split blocks, checked on the GPU recordings it was not set from.

Its value, 5 %, was set from one recording, ``FITTED_ON``: rank 0 of story 2 fixed at 4000 layers on two
GPUs, rehearsed on an H200 under a 15 GiB cap, whose first Adam step ran out asking for 1.96 GiB with
12.55 GiB allocated, 96.7 % of the cap.  That run's verdict is the allowance's by construction
(``tests/unit/test_plan_recordings.py`` says so where it checks it).  What the other capped recordings say:

- no rank whose allocator went past ``1 - FRAGMENTATION`` of its cap finished: story 2 under 15 GiB
  caps (five recordings, as asked and fixed, 100 %), the fragmentation scenario (99.3 % and 99.4 %, then
  out of memory) and a loop keeping its logits under a 24 GiB cap (98.3 %, then out of memory);
- no request failed below ``1 - FRAGMENTATION`` of the cap but in two cases that no fixed share could
  cover: DeepSpeed's set-up (which the plan counts as the memory the allocator holds, reserved: with the
  request, already past the cap), and a script that frees every other tensor by hand to fragment its
  memory (the ``allocator-fragmentation`` finding's case: the request would have fit in the free memory
  the allocator held, had it been in one piece);
- the one other request that failed inside the allowance, at 98.3 % of its cap (the logits loop), needs
  an allowance of at least 1.7 %.  No finished run came near its cap (the highest, 52.5 %), so none of
  them bounds the allowance from above.

Without a cap the allocator keeps what it freed: reserved over allocated at the peaks of the uncapped
recordings runs from 1.01 to 2.71 (``bench/allocator_shares.py``; ``bench/RESULTS.md``, 2026-12-06) while
nothing presses it to free its cache, and says nothing of what a capped allocator can hand out.
"""

from __future__ import annotations

import pytest

from shardtop.plan.cards import FRAGMENTATION
from tests.support.allocator_shares import FRAGMENTATION_FITTED_ON as FITTED_ON
from tests.support.allocator_shares import RankAllocator, gpu_ranks

USABLE = 1 - FRAGMENTATION
SET_UP_AS_RESERVED = {"h200-split/20261201-045047-zero3-linear-fixed-8617"}
"""DeepSpeed's set-up on one H200 at 4000 layers: it asked for its gradient partitions after cutting the
reduce bucket from a freed buffer; the plan counts set-up as reserved memory."""
FRAGMENTED_BY_HAND = {
    "h200-split/20261204-031816-gpu-fragmentation-85e4",
    "h200-split/20261204-031826-gpu-fragmentation-7491",  # the same, with expandable segments
}
"""``gpu/scenarios/fragmentation.py``: fills its 8 GiB cap with tensors and frees every other one."""


def capped() -> list[RankAllocator]:
    return [r for r in gpu_ranks() if r.limit]


def test_the_recordings_hold_capped_ranks_that_finished_and_that_ran_out() -> None:
    ranks = capped()
    assert FITTED_ON in {r.run for r in ranks}
    assert any(r.finished for r in ranks) and len([r for r in ranks if r.failed_at is not None]) >= 8


@pytest.mark.parametrize("rank", [r for r in capped() if r.reached > USABLE], ids=lambda r: f"{r.run}:{r.rank}")
def test_a_rank_whose_allocator_went_past_the_usable_share_of_its_cap_ran_out(rank: RankAllocator) -> None:
    """A plan calls such a peak no fit: no recording finished there."""
    assert not rank.finished and rank.oom is not None


@pytest.mark.parametrize(
    "rank", [r for r in capped() if r.failed_at is not None and r.run != FITTED_ON], ids=lambda r: f"{r.run}:{r.rank}"
)
def test_no_request_failed_inside_the_usable_share_of_the_cap_but_where_no_share_could_tell(
    rank: RankAllocator,
) -> None:
    oom, limit, failed_at = rank.oom, rank.limit, rank.failed_at
    assert oom is not None and limit is not None and failed_at is not None
    assert oom.allocated is not None and oom.reserved is not None and oom.requested_bytes is not None
    if rank.run in SET_UP_AS_RESERVED:
        assert oom.phase == "setup" and failed_at < USABLE
        assert oom.reserved + oom.requested_bytes > limit, "what the plan counts at set-up was past the cap"
    elif rank.run in FRAGMENTED_BY_HAND:
        assert failed_at < USABLE
        assert oom.reserved - oom.allocated >= oom.requested_bytes, "the free memory it held, in pieces, was enough"
    else:
        assert failed_at >= USABLE, f"{rank.run} ran out at {failed_at:.1%} of its cap"


def test_the_recording_it_was_fitted_on_ran_out_inside_the_allowance() -> None:
    """What the value was set from: 96.7 % of the cap failed, so 5 % is kept back (3.3 % would have done)."""
    (fitted,) = [r for r in capped() if r.run == FITTED_ON]
    assert fitted.failed_at is not None and USABLE < fitted.failed_at < 1
