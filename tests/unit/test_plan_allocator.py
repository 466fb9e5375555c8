"""The plan's model of PyTorch's caching allocator, on the sequences DeepSpeed's set-up makes (pure, no torch).

The recordings this reproduces are in ``test_plan_recordings.py``: one H200 capped at 15 GiB ran out in
``_configure_zero_optimizer`` asking for 3.91 GiB with 8.57 GiB allocated and 11.74 GiB reserved; and FSDP1's
flat shards, each counted as the whole segment the allocator made for it.
"""

from __future__ import annotations

from shardtop.plan.allocator import Alloc, EmptyCache, Free, beyond_tensors, need, new_segment_block

P = 4_202_496_000
"""An fp32 partition of 4000 layers of 512 x 512 on one rank."""
BUCKET = 800_000_000


def test_a_freed_buffer_cut_for_a_smaller_one_stays_held_and_the_next_larger_one_needs_its_own() -> None:
    steps = [Alloc("flat", P), Alloc("master", P), Alloc("first gradient", P), Free("first gradient"),
             Alloc("bucket", BUCKET), Alloc("gradients", P)]
    n = need(steps)
    assert n.allocated == 3 * P + BUCKET  # what is alive at the end
    assert n.held == 4 * P and n.at == "gradients"  # the bucket's segment keeps its 3.4 GB remainder
    assert n.requests[-2:] == (("bucket", 3 * P), ("gradients", 4 * P))


def test_a_freed_buffer_is_taken_whole_by_a_request_of_its_size() -> None:
    """bf16: the fp32 conversion is freed before the first gradient, which then takes its block."""
    steps = [Alloc("flat", P // 2), Alloc("conversion", P), Alloc("master", P), Free("conversion"),
             Alloc("first gradient", P), Free("first gradient"), Alloc("bucket", BUCKET // 2),
             Alloc("gradients", P // 2)]
    n = need(steps)
    assert n.held == P // 2 + 2 * P  # the gradients fit in what the bucket left of the freed block
    assert n.allocated == P // 2 + 2 * P


def test_a_bucket_larger_than_the_freed_block_leaves_it_for_the_gradients() -> None:
    small = BUCKET // 4
    steps = [Alloc("flat", small), Alloc("master", small), Alloc("first gradient", small),
             Free("first gradient"), Alloc("bucket", BUCKET), Alloc("gradients", small)]
    assert need(steps).held == 3 * small + BUCKET


def test_emptied_cache_and_scattered_tensors_are_not_held_once_freed() -> None:
    steps = [Alloc("partitions", P, scattered=True), Alloc("module", P // 4000), Free("module"),
             Free("partitions"), EmptyCache(), Alloc("flat", P)]
    n = need(steps)
    assert n.requests == (("partitions", P), ("module", P + P // 4000), ("flat", P))
    assert n.held == n.allocated == P + P // 4000


def test_free_blocks_merge_with_their_free_neighbours() -> None:
    steps = [Alloc("a", P), Free("a"), Alloc("b", P // 2), Alloc("c", P // 2), Free("b"), Free("c"),
             Alloc("d", P)]
    assert need(steps).held == P


MiB = 2**20
UNIT = 7_087_872 * 4
"""One of ``fsdp-auto-wrap``'s transformer blocks as an fp32 flat parameter: 27.04 MiB."""


def test_a_request_in_a_segment_of_its_own_counts_the_segment_where_at_most_1_mib_is_left() -> None:
    assert new_segment_block(UNIT) == 28 * MiB  # 0.96 MiB left: not split
    assert new_segment_block(UNIT // 2) == 14 * MiB  # a half shard: 0.48 MiB left
    root_half = 25_168_616  # 24.003 MiB: a 26 MiB segment, 1.997 MiB left, split
    assert new_segment_block(root_half) == 25_168_896 == root_half + 280
    assert new_segment_block(9 * MiB + 1) == 9 * MiB + 512  # under 10 MiB: cut from a 20 MiB segment
    assert new_segment_block(100) == 512 and new_segment_block(0) == 0
    assert beyond_tensors([UNIT] * 28) == 28 * 1_008_640
