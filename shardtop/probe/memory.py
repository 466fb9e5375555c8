"""Memory samples of one rank: its allocator, its process, and (from local rank 0) the node's GPUs.

A daemon thread writes a ``Memory`` event every ``interval`` seconds; the
probe also asks for one at each phase change (``sample_now``), which must be
cheap since it runs on the training thread: there it reuses the thread's
latest NVML reading instead of asking NVML again.  Nothing here raises into
training: a failed sample is skipped, and a thread that cannot be started
(a tight memory cap) leaves the samples taken at phase changes.

The last sample of all is the one CUDA's allocator gives when it runs out
(``install_cuda_oom_observer``): the exact size asked for and NVML's picture
at that moment, before the exception unwinds anything.

What fills the memory (the split by kind, the allocator's key stats, NVML's
figure for this process) is added to each sample by a ``detail`` callback,
``MemoryExplainer.sample`` (``memory_explain.py``), given the allocator's raw
stats so they are read once per sample.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import psutil

from shardtop.gpus import Nvml, nvml_or_none
from shardtop.probe.allocator import MemoryStats, allocator_stat
from shardtop.probe.allocator_cap import armed_cap
from shardtop.probe.heap import heap_in_use
from shardtop.rundir.events import Memory
from shardtop.rundir.memory_figures import GpuMemory

JOIN_TIMEOUT_S = 5.0
OBSERVATION_TTL_S = 60.0


def cuda_device_index(device: str) -> int | None:
    """``cuda:3`` -> 3; ``cuda`` -> -1 (whichever is current); anything else -> None."""
    if device == "cuda":
        return -1
    if device.startswith("cuda:"):
        try:
            return int(device[5:])
        except ValueError:
            return None
    return None


def allocator_numbers(stats: MemoryStats) -> tuple[int, int, int]:
    """(allocated, reserved, peak allocated) from the allocator's stats, nested or flat; 0 where missing.

    Nested is what ``torch._C._cuda_memoryStats`` returns (28 µs on an H200);
    flat is ``torch.cuda.memory_stats()`` (195 µs: it flattens the nested dict
    in Python), too slow for a sample taken on the training thread.
    """
    return (
        allocator_stat(stats, "allocated_bytes") or 0,
        allocator_stat(stats, "reserved_bytes") or 0,
        allocator_stat(stats, "allocated_bytes", "peak") or 0,
    )


def cuda_allocator_stats(torch: Any, index: int) -> MemoryStats:
    """The caching allocator's stats for a device, by the cheapest way this torch offers."""
    raw = getattr(torch._C, "_cuda_memoryStats", None)
    stats: MemoryStats = raw(index) if raw is not None else torch.cuda.memory_stats(index)
    return stats


def cuda_allocated(torch: Any, device: str) -> int:
    """Bytes allocated on a CUDA device (``cuda`` is the current one), read as cheaply as
    ``cuda_allocator_stats`` reads them: ``torch.cuda.memory_allocated`` goes through the flat stats."""
    index = cuda_device_index(device)
    if index is None or index < 0:
        index = int(torch.cuda.current_device())
    return allocator_numbers(cuda_allocator_stats(torch, index))[0]


class MemorySampler:
    """Writes ``Memory`` events in the background at ``1 / interval`` Hz (2 Hz by default)."""

    def __init__(
        self,
        write: Callable[[Memory], object],
        *,
        device: str,
        interval: float = 0.5,
        sample_gpus: bool,
        limit: int | None,
        detail: Callable[[Memory, MemoryStats | None, bool], Memory] | None = None,
    ) -> None:
        self.write = write
        self.detail = detail
        """The sample with the split and the allocator's stats added: (sample, raw allocator stats or None, fresh)."""
        self.device = device
        self.interval = max(0.01, float(interval))
        self.sample_gpus = sample_gpus
        self.limit = limit
        self.samples = 0
        self.failures = 0
        self._process = psutil.Process()
        self._rss_value = 0
        self._rss_at = -1e9
        self._heap_value: int | None = None
        self._cuda = self._resolve_cuda(device)
        self._total: int | None = None
        """The GPU's memory in bytes, read once (for a cap given as a fraction of it)."""
        self._nvml: Nvml | None = None
        self._nvml_tried = False
        self._nvml_lock = threading.Lock()
        self._gpus: list[GpuMemory] | None = None
        self._gpus_at = 0.0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def use_device(self, device: str) -> None:
        """Sample ``device`` from now on: the rank's engine put it there after sampling began."""
        self._cuda, self._total = self._resolve_cuda(device), None
        self.device = device

    @staticmethod
    def _resolve_cuda(device: str) -> int | None:
        """The CUDA index, fixed now: the sampler thread's own current device is always 0."""
        index = cuda_device_index(device)
        if index == -1:
            torch = sys.modules.get("torch")
            try:
                index = torch.cuda.current_device() if torch is not None and torch.cuda.is_initialized() else 0
            except Exception:  # noqa: BLE001
                index = 0
        return index

    # -- lifecycle ---------------------------------------------------------------

    def start(self) -> None:
        """Start the thread; raises ``RuntimeError`` if none can be started (a tight memory cap).

        Then nothing is left half started: ``sample_now`` still works and ``stop`` is a no-op.
        """
        if self._thread is not None:
            return
        self._stop.clear()
        thread = threading.Thread(target=self._run, name="shardtop-memory", daemon=True)
        thread.start()
        self._thread = thread

    def stop(self) -> None:
        """Stop and join the thread; safe to call twice, or without ``start``."""
        self._stop.set()
        thread, self._thread = self._thread, None
        if thread is not None and thread is not threading.current_thread():
            thread.join(JOIN_TIMEOUT_S)

    def _run(self) -> None:
        next_at = time.monotonic()
        while not self._stop.is_set():
            try:
                self.write(self._sample(fresh=True))
                self.samples += 1
            except Exception:  # noqa: BLE001 - a sampler must never take training down
                self.failures += 1
            next_at += self.interval
            delay = next_at - time.monotonic()
            if delay < 0:  # fell behind (a slow NVML call): keep the pace, not the debt
                next_at = time.monotonic()
                delay = 0.0
            if self._stop.wait(delay):
                break

    # -- sampling -----------------------------------------------------------------

    def sample_now(self, fresh_rss: bool = False, heap: int | None = None) -> Memory | None:
        """One sample, written now (on the caller's thread, reusing the thread's NVML, RSS and heap readings;
        ``fresh_rss`` reads RSS and the heap anew: the start of each step's forward, where memory is
        compared step to step; ``heap``: a heap reading just taken, to use instead).

        None if it could not be taken: this runs on the training thread and never raises.
        """
        try:
            sample = self._sample(fresh=False, fresh_rss=fresh_rss, heap=heap)
            self.write(sample)
        except Exception:  # noqa: BLE001
            self.failures += 1
            return None
        self.samples += 1
        return sample

    def _sample(self, fresh: bool, fresh_rss: bool = False, heap: int | None = None) -> Memory:
        host_rss = self._host_rss(fresh or fresh_rss)
        stats = self._allocator_stats() if self._cuda is not None else None
        allocated, reserved, peak = allocator_numbers(stats) if stats is not None else (None, None, None)
        cap = armed_cap() if self._cuda is None else None
        if cap is not None:  # gpu_mem_limit on CPU, kept by the allocator: what it handed out is allocated
            allocated, peak = cap.held(), cap.peak()
        sample = Memory(
            device=self.device,
            allocated=allocated,
            reserved=reserved,
            peak=peak,
            limit=self.limit if self.limit is not None else self._fraction_cap(),
            host_rss=host_rss,
            host_heap=self._host_heap(fresh or fresh_rss, heap) if self._cuda is None else None,
            gpus=self._gpu_reading(fresh) if self.sample_gpus else None,
        )
        return self.detail(sample, stats, fresh) if self.detail is not None else sample

    def _fraction_cap(self) -> int | None:
        """The cap a script set itself (``torch.cuda.set_per_process_memory_fraction``), in bytes; None
        without one.  The allocator refuses to reserve past it, so a rank runs out of memory there."""
        if self._cuda is None:
            return None
        torch: Any = sys.modules.get("torch")
        get = getattr(getattr(torch, "cuda", None), "get_per_process_memory_fraction", None)
        if get is None or not torch.cuda.is_initialized():
            return None
        try:
            fraction = float(get(self._cuda))
            if not 0 < fraction < 1:
                return None
            if self._total is None:
                self._total = int(torch.cuda.get_device_properties(self._cuda).total_memory)
        except Exception:  # noqa: BLE001 - a torch without it: no cap known
            return None
        return int(fraction * self._total)

    def heap_now(self) -> int | None:
        """The C allocator's bytes in use, read now."""
        return self._host_heap(True)

    def _host_heap(self, fresh: bool, taken: int | None = None) -> int | None:
        """The C allocator's bytes in use: ``taken`` (a reading just taken), else read anew if ``fresh``,
        else the last reading.

        A reading can take most of a millisecond (``heap.py``), so the training thread reads it once a step,
        at the start of the forward, where steps are compared; the sampler's thread reads it at each of its
        samples (ctypes lets go of the GIL meanwhile).
        """
        if heap_in_use is None:
            return None
        if taken is not None:
            self._heap_value = taken
        elif fresh or self._heap_value is None:
            self._heap_value = heap_in_use()
        return self._heap_value

    def _host_rss(self, fresh: bool) -> int:
        """The process's RSS; from the training thread, the thread's last reading unless it is stale.

        Reading ``/proc`` costs ~0.1 ms under gVisor, and RSS moves slowly
        next to the allocator numbers a phase-change sample is taken for.
        """
        now = time.monotonic()
        if fresh or now - self._rss_at > 2 * self.interval:
            try:
                self._rss_value = int(self._process.memory_info().rss)
                self._rss_at = now
            except (psutil.Error, OSError):
                pass
        return self._rss_value

    def _allocator_stats(self) -> MemoryStats | None:
        torch = sys.modules.get("torch")
        if torch is None or not torch.cuda.is_initialized() or self._cuda is None:
            return None
        try:
            return cuda_allocator_stats(torch, self._cuda)
        except Exception:  # noqa: BLE001
            return None

    def _gpu_reading(self, fresh: bool) -> list[GpuMemory] | None:
        """NVML's picture; from the training thread, the thread's last one unless it is stale."""
        stale = time.monotonic() - self._gpus_at > 2 * self.interval
        if not fresh and not stale:
            return self._gpus
        if not self._nvml_lock.acquire(blocking=fresh):
            return self._gpus  # the thread is reading NVML right now
        try:
            if not self._nvml_tried:
                self._nvml_tried = True
                self._nvml = nvml_or_none()
            if self._nvml is None:
                return None
            try:
                self._gpus = self._nvml.sample()
            except Exception:  # noqa: BLE001 - NVML hiccup: keep the last reading
                return self._gpus
            self._gpus_at = time.monotonic()
            return self._gpus
        finally:
            self._nvml_lock.release()


# -- the CUDA allocator's word at an OOM ----------------------------------------------------


@dataclass(frozen=True)
class ObservedOom:
    """What CUDA's allocator said just before it raised, and what NVML saw then."""

    device: int
    requested: int
    device_total: int
    """The device's memory, or the per-process cap when one is set."""
    device_free: int
    gpus: list[GpuMemory] | None
    autograd_node: Any
    """The autograd node running when the allocation failed (in a backward), else None."""
    monotonic: float


_observed: ObservedOom | None = None
_observer_lock = threading.Lock()
_observer_installed = False


def record_observation(observation: ObservedOom | None) -> None:
    """Remember the allocator's last word (the observer does)."""
    global _observed
    _observed = observation


def install_cuda_oom_observer(callback: Callable[[ObservedOom], None] | None = None) -> bool:
    """Attach to CUDA's allocator once per process; True if attached (now or before).

    The observer records an ``ObservedOom`` for ``attribute()``, then calls
    ``callback`` with it.  It never raises into the allocator.
    """
    global _observer_installed
    torch = sys.modules.get("torch")
    attach = getattr(getattr(torch, "_C", None), "_cuda_attach_out_of_memory_observer", None)
    if torch is None or attach is None or not torch.cuda.is_available():
        return False
    with _observer_lock:
        if not _observer_installed:
            running_node = getattr(torch._C, "_current_autograd_node", lambda: None)

            def observe(device: int, requested: int, device_total: int, device_free: int) -> None:
                try:
                    nvml = nvml_or_none()
                    observation = ObservedOom(
                        int(device), int(requested), int(device_total), int(device_free),
                        nvml.sample() if nvml is not None else None, running_node(), time.monotonic(),
                    )
                    record_observation(observation)
                    if callback is not None:
                        callback(observation)
                except BaseException:  # noqa: BLE001 - the allocator must raise its own error
                    pass

            attach(observe)
            _observer_installed = True
    return True


def observation_matches(observation: ObservedOom | None, device: int | None, parsed: int | None, now: float) -> bool:
    """Is the observer's record about this OOM: same device, recent, the size the message gives?"""
    if observation is None or device is None or observation.device != device:
        return False
    if now - observation.monotonic > OBSERVATION_TTL_S:
        return False
    return parsed is None or abs(observation.requested - parsed) <= max(1024, parsed // 100)


def take_observation(index: int | None, parsed: int | None) -> ObservedOom | None:
    """The observer's record if it is about this OOM; used once."""
    device = current_cuda_index() if index == -1 else index
    if not observation_matches(_observed, device, parsed, time.monotonic()):
        return None
    observation = _observed
    record_observation(None)
    return observation


def current_cuda_index() -> int | None:
    torch = sys.modules.get("torch")
    try:
        return int(torch.cuda.current_device()) if torch is not None and torch.cuda.is_initialized() else None
    except Exception:  # noqa: BLE001
        return None


def allocator_state(index: int) -> tuple[int, int, int] | None:
    """(allocated, reserved, total) of a CUDA device, or None where CUDA never started."""
    torch = sys.modules.get("torch")
    if torch is None or not torch.cuda.is_initialized():
        return None
    try:
        index = torch.cuda.current_device() if index < 0 else index
        allocated, reserved, _ = allocator_numbers(cuda_allocator_stats(torch, index))
        return allocated, reserved, int(torch.cuda.get_device_properties(index).total_memory)
    except Exception:  # noqa: BLE001 - the OOM record matters more than its allocator numbers
        return None


def gpus_now() -> list[GpuMemory] | None:
    """Every local GPU as NVML sees it now; None without a driver."""
    try:
        nvml = nvml_or_none()
        return nvml.sample() if nvml is not None else None
    except Exception:  # noqa: BLE001
        return None
