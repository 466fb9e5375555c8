"""Sample the GPUs (NVML) and the processes on them (psutil) for the home view."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from types import MappingProxyType

import msgspec

from shardtop.gpus import (
    GpuProcessInfo,
    GpuProcessUse,
    GpuSource,
    GpuUnavailable,
    HostProbe,
    HostSample,
    Nvml,
    ProcessListing,
    uses_from_pids,
)
from shardtop.rundir.memory_figures import GpuMemory

HISTORY = 120
"""Memory samples kept per GPU for the sparkline."""
PSUTIL_EVERY = 1.0
"""Seconds between looks at the host and the GPU processes through psutil."""
MEMORY_STEP = 4 * 2**20
"""Memory is shown to 0.01 GiB at best; finer changes are noise that would only cost repaints."""


def _step(value: int | None, step: int = MEMORY_STEP) -> int | None:
    return None if value is None else int(round(value / step) * step)


def gpus_as_shown(gpus: Iterable[GpuMemory]) -> tuple[GpuMemory, ...]:
    """NVML samples at the precision the screen shows them (memory to 4 MiB, power to the watt)."""
    return tuple(
        msgspec.structs.replace(g, used=_step(g.used), power_w=None if g.power_w is None else float(round(g.power_w)))
        for g in gpus
    )


def as_shown(
    gpus: list[GpuMemory], processes: list[GpuProcessInfo], host: HostSample
) -> tuple[tuple[GpuMemory, ...], tuple[GpuProcessInfo, ...], HostSample]:
    """The samples at the precision the screen shows them, so an unchanged screen is an equal snapshot.

    At a 0.1 s refresh NVML's power and psutil's CPU figures move on every sample;
    comparing them unrounded would repaint the home view ten times a second for nothing.
    """
    shown_gpus = gpus_as_shown(gpus)
    shown_processes = tuple(
        replace(
            p,
            gpu_memory=_step(p.gpu_memory),
            host_rss=_step(p.host_rss),
            cpu_percent=None if p.cpu_percent is None else float(round(p.cpu_percent)),
        )
        for p in processes
    )
    shown_host = replace(host, cpu_percent=float(round(host.cpu_percent)), memory_used=_step(host.memory_used) or 0)
    return shown_gpus, shown_processes, shown_host


@dataclass(frozen=True)
class GpuSnapshot:
    gpus: tuple[GpuMemory, ...]
    history: Mapping[int, tuple[int, ...]]
    """Used bytes of each GPU (by index), oldest first."""
    processes: tuple[GpuProcessInfo, ...]
    host: HostSample | None
    unavailable: str | None
    """Why there are no GPUs (no driver...), or None."""
    serial: int


def open_nvml() -> tuple[GpuSource | None, str | None]:
    """The real NVML, or why it is not there."""
    try:
        return Nvml(), None
    except GpuUnavailable as e:
        return None, str(e)


class GpuFeed:
    """One sample per ``poll``; ``source`` is NVML, or recorded samples in tests."""

    def __init__(
        self,
        source: GpuSource | None = None,
        host: HostProbe | None = None,
        unavailable: str | None = None,
        opener: Callable[[], tuple[GpuSource | None, str | None]] | None = open_nvml,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.source = source
        self.host = host
        self.unavailable = unavailable
        self._opener = opener if source is None and unavailable is None else None
        self._clock = clock
        self._history: dict[int, tuple[int, ...]] = {}
        self._serial = 0
        self._last: tuple[object, ...] | None = None
        self._looked_at = float("-inf")
        self._looked: tuple[frozenset[tuple[int, int]], list[GpuProcessInfo], HostSample] | None = None

    def poll(self) -> GpuSnapshot | None:
        if self._opener is not None:
            self.source, self.unavailable = self._opener()
            self._opener = None
        if self.host is None:
            self.host = HostProbe()
        gpus: list[GpuMemory] = []
        if self.source is not None:
            try:
                gpus = self.source.sample()
            except GpuUnavailable as e:
                self.unavailable = str(e)
                self.source = None
            except Exception as e:  # NVML can fail mid-run (driver reset, GPU lost)
                self.unavailable = f"NVML stopped answering: {e}"
                self.source = None
        if isinstance(self.source, ProcessListing):
            uses = self.source.process_uses()
        else:
            uses = uses_from_pids(gpus)
        for g in gpus:
            self._history[g.index] = (self._history.get(g.index, ()) + (g.used,))[-HISTORY:]
        processes, host = self._look_at_processes(uses)
        shown, shown_processes, shown_host = as_shown(gpus, processes, host)
        key = (shown, shown_processes, shown_host, self.unavailable)
        if key == self._last and self._serial:
            return None
        self._last = key
        self._serial += 1
        return GpuSnapshot(
            gpus=shown,
            history=MappingProxyType(dict(self._history)),
            processes=shown_processes,
            host=shown_host,
            unavailable=self.unavailable,
            serial=self._serial,
        )

    def _look_at_processes(self, uses: list[GpuProcessUse]) -> tuple[list[GpuProcessInfo], HostSample]:
        """psutil's view, at most once per ``PSUTIL_EVERY`` s (NVML's may come ten times a second).

        CPU percentages over a tenth of a second are noise; a process that comes
        or goes on a GPU is looked at at once.
        """
        assert self.host is not None
        pids = frozenset((u.pid, u.gpu) for u in uses)
        now = self._clock()
        cached = self._looked
        if cached is None or cached[0] != pids or now - self._looked_at >= PSUTIL_EVERY:
            cached = self._looked = (pids, self.host.describe(uses), self.host.host())
            self._looked_at = now
        return cached[1], cached[2]
