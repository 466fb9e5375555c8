"""The room kept for an OOM record is address space a data-segment cap counts, given back on demand."""

from __future__ import annotations

import resource

from shardtop.probe.cap import MemoryReserve, data_segment_exhausted, thread_stack_bytes
from shardtop.runner.limits import data_segment_bytes as vm_data

MiB = 1 << 20


def test_the_reserve_counts_against_rlimit_data_until_released() -> None:
    before = vm_data()
    reserve = MemoryReserve(32 * MiB)
    assert reserve.held and vm_data() - before >= 32 * MiB
    assert reserve.release()
    assert vm_data() - before < 1 * MiB
    assert not reserve.release() and not reserve.held


def test_without_a_cap_nothing_is_starved() -> None:
    soft, _ = resource.getrlimit(resource.RLIMIT_DATA)
    assert soft == resource.RLIM_INFINITY  # the test process runs uncapped
    assert not data_segment_exhausted(1 << 60)
    assert thread_stack_bytes() >= 1 * MiB
