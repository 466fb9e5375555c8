"""NVML behind a small interface: how many GPUs, and what each holds now.

Used by the launcher (how many GPUs are there?), by each node's local rank 0
(NVML samples into the events) and by the TUI's GPU panel.  No torch here.
``nvidia-ml-py`` is imported as ``pynvml``.
"""

from __future__ import annotations

import threading
from typing import Protocol

from shardtop.events import GpuMemory


class GpuUnavailable(Exception):
    """No NVIDIA driver, or NVML failed to start; the message says which."""


class GpuSource(Protocol):
    """Anything that can report the GPUs: NVML, or recorded samples in tests."""

    def sample(self) -> list[GpuMemory]: ...


class Nvml:
    """The real NVML.  ``Nvml()`` raises ``GpuUnavailable`` without a driver."""

    _lock = threading.Lock()
    _started = False

    def __init__(self) -> None:
        try:
            import pynvml
        except ImportError as e:  # pragma: no cover - a declared dependency
            raise GpuUnavailable(f"nvidia-ml-py is not installed ({e})") from None
        self._nvml = pynvml
        with Nvml._lock:
            if not Nvml._started:
                try:
                    pynvml.nvmlInit()
                except pynvml.NVMLError as e:
                    raise GpuUnavailable(f"no NVIDIA driver: {e}") from None
                Nvml._started = True
        self._handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
        self._static = [self._static_info(i, h) for i, h in enumerate(self._handles)]

    def _static_info(self, index: int, handle: object) -> tuple[str, str]:
        n = self._nvml
        name = n.nvmlDeviceGetName(handle)
        uuid = n.nvmlDeviceGetUUID(handle)
        return (name.decode() if isinstance(name, bytes) else name, uuid.decode() if isinstance(uuid, bytes) else uuid)

    @property
    def count(self) -> int:
        return len(self._handles)

    def sample(self, with_processes: bool = True) -> list[GpuMemory]:
        n = self._nvml
        out: list[GpuMemory] = []
        for i, h in enumerate(self._handles):
            mem = n.nvmlDeviceGetMemoryInfo(h)
            util = _maybe(lambda: n.nvmlDeviceGetUtilizationRates(h).gpu, n)
            temp = _maybe(lambda: n.nvmlDeviceGetTemperature(h, n.NVML_TEMPERATURE_GPU), n)
            power = _maybe(lambda: n.nvmlDeviceGetPowerUsage(h) / 1000.0, n)
            pids: list[int] = []
            if with_processes:
                procs = _maybe(lambda: n.nvmlDeviceGetComputeRunningProcesses(h), n) or []
                pids = sorted({p.pid for p in procs})
            name, uuid = self._static[i]
            out.append(
                GpuMemory(
                    index=i, name=name, uuid=uuid, used=int(mem.used), total=int(mem.total),
                    util=util, temperature=temp, power_w=power, pids=pids,
                )
            )
        return out


def _maybe(fn, nvml):  # type: ignore[no-untyped-def]
    """NVML answers NOT_SUPPORTED for some fields on some boards; that is not an error."""
    try:
        return fn()
    except nvml.NVMLError:
        return None


def gpu_count() -> int:
    """GPUs NVML sees; 0 where there is no driver."""
    try:
        return Nvml().count
    except GpuUnavailable:
        return 0


def nvml_or_none() -> Nvml | None:
    try:
        return Nvml()
    except GpuUnavailable:
        return None
