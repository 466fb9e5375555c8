"""The memory sampler: a real thread, real psutil, real (absent) NVML."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from shardtop.gpus import nvml_or_none
from shardtop.probe.heap import heap_in_use
from shardtop.probe.memory import MemorySampler, allocator_numbers, cuda_allocated, cuda_device_index
from shardtop.rundir.event_files import EventWriter, read_all
from shardtop.rundir.events import Memory
from tests.support.waiting import wait_until

no_driver = pytest.mark.skipif(nvml_or_none() is not None, reason="an NVIDIA driver is present")


def test_cuda_device_index() -> None:
    assert cuda_device_index("cuda:3") == 3
    assert cuda_device_index("cuda") == -1
    assert cuda_device_index("cpu") is None
    assert cuda_device_index("cuda:x") is None


def test_allocator_numbers() -> None:
    stats = {"allocated_bytes.all.current": 10, "reserved_bytes.all.current": 20, "allocated_bytes.all.peak": 15}
    assert allocator_numbers(stats) == (10, 20, 15)
    assert allocator_numbers({}) == (0, 0, 0)
    nested = {
        "allocated_bytes": {"all": {"current": 10, "peak": 15}, "large_pool": {"current": 8, "peak": 8}},
        "reserved_bytes": {"all": {"current": 20, "peak": 20}},
    }
    assert allocator_numbers(nested) == (10, 20, 15)


def test_cuda_allocated_reads_the_nested_stats_of_the_named_or_current_device() -> None:
    """CI has no GPU: torch's CUDA entry points stand in, as torch 2.11-2.14 name them."""
    asked: list[int] = []

    def nested(index: int) -> dict[str, Any]:
        asked.append(index)
        return {"allocated_bytes": {"all": {"current": 100 + index, "peak": 0}},
                "reserved_bytes": {"all": {"current": 0, "peak": 0}}}

    torch = SimpleNamespace(_C=SimpleNamespace(_cuda_memoryStats=nested),
                            cuda=SimpleNamespace(current_device=lambda: 5))
    assert cuda_allocated(torch, "cuda:2") == 102
    assert cuda_allocated(torch, "cuda") == 105
    assert asked == [2, 5]


def test_sampler_samples_on_its_own_while_the_training_thread_is_busy(tmp_path: Path) -> None:
    """The sampler is a thread of its own: samples keep coming while this (training) thread computes."""
    writer = EventWriter(tmp_path / "events" / "rank-0.jsonl", rank=0)
    sampler = MemorySampler(writer.write, device="cpu", interval=0.05, sample_gpus=False, limit=123)
    sampler.start()
    busy = 0
    deadline = time.monotonic() + 60  # only so that a sampler that never samples fails instead of hanging
    while sampler.samples < 5 and time.monotonic() < deadline:
        busy = sum(i * i for i in range(10_000)) + busy % 7  # the training thread holds the interpreter
    sampler.stop()
    writer.close()
    events, _ = read_all(tmp_path / "events")
    samples = [e for e in events if isinstance(e, Memory)]
    assert len(samples) >= 5 and sampler.failures == 0
    assert [s.t for s in samples] == sorted(s.t for s in samples), "written in the order taken"
    for sample in samples:
        assert sample.host_rss > 0
        assert (sample.device, sample.limit) == ("cpu", 123)
        assert sample.allocated is None and sample.gpus is None  # CPU: no allocator numbers, GPUs not asked


def test_the_default_pace_is_two_samples_a_second() -> None:
    assert MemorySampler(lambda sample: None, device="cpu", sample_gpus=False, limit=None).interval == 0.5


class _Clock:
    """The sampler's clock and its stop event, on a timeline the test drives: each sample costs ``costs[i]``
    seconds, each wait lasts what the sampler asked for, and the run ends after ``waits`` waits."""

    def __init__(self, costs: list[float], waits: int) -> None:
        self.now = 0.0
        self.costs = list(costs)
        self.waits = waits
        self.asked: list[float] = []
        self.taken_at: list[float] = []

    def monotonic(self) -> float:
        return self.now

    def write(self, sample: Memory) -> None:
        self.taken_at.append(self.now)
        self.now += self.costs.pop(0) if self.costs else 0.0

    def is_set(self) -> bool:
        return len(self.asked) >= self.waits

    def wait(self, seconds: float) -> bool:
        self.asked.append(round(seconds, 9))
        self.now += seconds
        return self.is_set()


def test_each_wait_is_what_is_left_of_the_interval_and_a_late_sample_is_not_made_up(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Samples start a whole interval apart whatever each costs; one that overruns the interval is followed
    at once, and the pace then restarts from there instead of sampling twice to catch up."""
    clock = _Clock(costs=[0.1, 0.1, 0.7, 0.1, 0.1], waits=5)
    monkeypatch.setattr("shardtop.probe.memory.time", SimpleNamespace(monotonic=clock.monotonic))
    sampler = MemorySampler(clock.write, device="cpu", interval=0.5, sample_gpus=False, limit=None)
    sampler._stop = clock  # type: ignore[assignment]
    sampler._run()
    assert clock.asked == [0.4, 0.4, 0.0, 0.4, 0.4]
    assert [round(t, 9) for t in clock.taken_at] == [0.0, 0.5, 1.0, 1.7, 2.2]


def test_stop_is_prompt_and_idempotent() -> None:
    """Stopping ends the wait between samples: with an hour between them the thread is gone when stop
    returns (it would still be waiting if stop waited out the interval), and nothing more was written."""
    written: list[Memory] = []
    sampler = MemorySampler(written.append, device="cpu", interval=3600.0, sample_gpus=False, limit=None)
    sampler.stop()  # before start: nothing to do
    sampler.start()
    wait_until(lambda: len(written) == 1, 60, "the first sample")
    sampler.stop()
    sampler.stop()
    assert not any(t.name == "shardtop-memory" for t in threading.enumerate())
    assert len(written) == 1


def test_sample_now_writes_and_returns() -> None:
    written: list[Memory] = []
    sampler = MemorySampler(written.append, device="cpu", sample_gpus=False, limit=None)
    sample = sampler.sample_now()
    assert written == [sample]
    assert sample.host_rss > 0


@no_driver
def test_without_a_driver_gpus_are_none_and_not_retried() -> None:
    written: list[Memory] = []
    sampler = MemorySampler(written.append, device="cpu", interval=0.05, sample_gpus=True, limit=None)
    sampler.start()
    wait_until(lambda: len(written) >= 3, 60, "three samples")
    sampler.stop()
    sampler.sample_now()
    assert len(written) >= 3
    assert all(sample.gpus is None for sample in written)
    assert sampler._nvml_tried and sampler._nvml is None


def test_a_failing_writer_never_stops_the_thread() -> None:
    calls: list[int] = []

    def write(sample: Memory) -> None:
        calls.append(1)
        raise OSError("disk full")

    sampler = MemorySampler(write, device="cpu", interval=0.05, sample_gpus=False, limit=None)
    sampler.start()
    wait_until(lambda: len(calls) >= 3, 60, "three failed writes")
    sampler.stop()
    assert len(calls) >= 3 and sampler.failures == len(calls)
    sampler.sample_now()  # on the training thread too: counted, not raised
    assert sampler.failures == len(calls)


@pytest.mark.skipif(heap_in_use is None, reason="this C library has no mallinfo2")
def test_the_heap_is_read_at_each_forward_and_kept_for_the_other_phases() -> None:
    """A heap reading costs up to a millisecond on a fragmented heap: the training thread reads it at the start
    of each forward, where steps are compared, and its other phases' samples carry that reading."""
    written: list[Memory] = []
    sampler = MemorySampler(written.append, device="cpu", sample_gpus=False, limit=None)
    kept = [bytearray(1 << 20) for _ in range(4)]  # the heap grows by these between the forwards
    first = sampler.sample_now(fresh_rss=True)
    kept += [bytearray(8 << 20) for _ in range(4)]
    backward = sampler.sample_now()
    second = sampler.sample_now(fresh_rss=True)
    assert first is not None and backward is not None and second is not None
    assert first.host_heap is not None and second.host_heap is not None
    assert backward.host_heap == first.host_heap, "a phase's sample reuses the forward's reading"
    # 32 MiB more, less what Python freed meanwhile (a few KiB)
    assert second.host_heap - first.host_heap >= 31 << 20, "the next forward reads it anew"
    given = sampler.sample_now(fresh_rss=True, heap=12345)
    assert given is not None and given.host_heap == 12345, "a reading just taken is used as it is"
    del kept
