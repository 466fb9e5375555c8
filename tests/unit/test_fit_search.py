"""The search for the largest micro-batch: it starts where the plan points, ends on a batch that fits beside
one that does not, and needs fewer rehearsals than halving from the plan's batch would.

Memory here is a line, as a rank's is to first order (what does not grow with the batch, plus what one
sample adds), with the plan's figure for a sample off by as much as the plans of CPU runs are."""

from __future__ import annotations

import math

import pytest

from shardtop.fit.predict import largest_batch
from shardtop.fit.search import MAX_BATCH, BoundarySearch, Probe

MiB = 1 << 20


def run_search(start: int, limit: int, fixed: int, per_sample: int, plan_per_sample: float,
               ceiling: int = MAX_BATCH) -> tuple[BoundarySearch, list[int]]:
    """Search against a rank whose peak is ``fixed + per_sample * batch``; the batches rehearsed."""
    search = BoundarySearch(start=start, limit=limit, plan_slope=plan_per_sample, ceiling=ceiling)
    rehearsed: list[int] = []
    while (batch := search.next_batch()) is not None:
        assert batch not in rehearsed, f"rehearsed {batch} twice: {rehearsed}"
        rehearsed.append(batch)
        peak = fixed + per_sample * batch
        fits = peak <= limit
        search = search.after(Probe(batch, "fits" if fits else "out of memory", peak if fits else None))
        assert len(rehearsed) < 40, rehearsed
    return search, rehearsed


CASES = [
    # (plan's batch, fixed bytes, bytes a sample, the plan's bytes a sample): a plan on the mark, one that
    # leaves out the process's own heap (CPU), slopes 40 % low and 40 % high, a plan far too low
    (79, 30 * MiB, 740_000, 740_000),
    (98, 30 * MiB, 740_000, 530_000),
    (31, 70 * MiB, 3_300_000, 2_600_000),
    (40, 20 * MiB, 2_000_000, 2_800_000),
    (3, 20 * MiB, 2_000_000, 2_000_000),
    (500, 10 * MiB, 100_000, 60_000),
]


@pytest.mark.parametrize(("start", "fixed", "per_sample", "plan_per_sample"), CASES)
def test_the_search_ends_on_the_boundary(start: int, fixed: int, per_sample: int, plan_per_sample: float) -> None:
    limit = 64 * MiB + fixed // 2
    boundary = (limit - fixed) // per_sample
    search, rehearsed = run_search(start, limit, fixed, per_sample, plan_per_sample)
    assert rehearsed[0] == start, "the first batch is the plan's"
    assert search.found and search.fitting is not None
    assert search.fitting.batch == boundary and search.too_large == boundary + 1
    halving = math.ceil(math.log2(max(start, boundary) + 1)) + 2
    assert len(rehearsed) <= halving, (rehearsed, halving)


def test_a_plan_on_the_mark_needs_three_rehearsals() -> None:
    """The plan's batch fits; the line through its peak lands on the boundary; the next batch runs out."""
    limit, fixed, per_sample = 100 * MiB, 20 * MiB, 2 * MiB
    _, rehearsed = run_search(36, limit, fixed, per_sample, 2 * MiB)
    assert rehearsed == [36, 40, 41]


def test_nothing_fits_ends_at_one_sample() -> None:
    search, rehearsed = run_search(10, 10 * MiB, 20 * MiB, MiB, MiB)
    assert search.found and search.fitting is None and search.too_large == 1
    assert rehearsed[-1] == 1


def test_the_ceiling_ends_a_search_that_never_runs_out() -> None:
    search, rehearsed = run_search(4, 10**15, MiB, 1, 1.0, ceiling=64)
    assert search.found and search.fitting is not None and search.fitting.batch == 64
    assert search.too_large is None and rehearsed[0] == 4


def test_a_rehearsal_that_failed_otherwise_stops_the_search() -> None:
    search = BoundarySearch(start=8, limit=MiB, plan_slope=1.0).after(Probe(8, "failed", None))
    assert search.next_batch() is None and not search.found and search.failed is not None


def test_the_plans_largest_batch_is_the_last_within_what_it_may_use() -> None:
    def peak(batch: int) -> int:
        return 1000 + 7 * batch

    assert largest_batch(peak, 1000 + 7 * 123) == 123
    assert largest_batch(peak, 999) is None
    assert largest_batch(peak, 10**9, ceiling=256) == 256
