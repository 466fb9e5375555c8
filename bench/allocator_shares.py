"""How much of its limit the CUDA caching allocator handed out in each GPU recording (no GPU needed).

For each capped rank under ``tests/fixtures/runs``: its cap, the share of it
the allocator had allocated at its peak, and where it ran out, allocated plus
asked for as a share of the cap; for the uncapped ranks, reserved over
allocated at the allocator's peaks.  What ``FRAGMENTATION``
(``shardtop/plan/cards.py``) is checked against.

    python bench/allocator_shares.py
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from shardtop.plan.cards import FRAGMENTATION  # noqa: E402
from tests.support.allocator_shares import gpu_ranks  # noqa: E402

GiB = 1 << 30


def main() -> None:
    ranks = gpu_ranks()
    print(f"FRAGMENTATION = {FRAGMENTATION}: a plan's peak above {1 - FRAGMENTATION:.0%} of a cap is no fit")
    print(f"{'run':60} {'rank':>4} {'cap':>8} {'peak/cap':>9} {'failed at':>9}  outcome")
    for r in ranks:
        if not r.limit:
            continue
        failed = f"{r.failed_at:9.1%}" if r.failed_at is not None else f"{'':9}"
        outcome = "finished" if r.finished else (f"out of memory ({r.oom.phase})" if r.oom else "stopped")
        print(f"{r.run:60} {r.rank:>4} {r.limit / GiB:6.1f} G {r.reached:9.1%} {failed}  {outcome}")
    free = [r for r in ranks if not r.limit and r.peak_allocated]
    ratios = sorted(r.peak_reserved / r.peak_allocated for r in free)
    print(f"without a cap, {len(free)} ranks: peak reserved / peak allocated from {ratios[0]:.3f} to "
          f"{ratios[-1]:.3f}, median {statistics.median(ratios):.3f}")
    for r in free:
        print(f"  {r.run:60} {r.rank:>4} {r.peak_allocated / GiB:7.3f} GiB allocated, "
              f"{r.peak_reserved / r.peak_allocated:.3f}x reserved")


if __name__ == "__main__":
    main()
