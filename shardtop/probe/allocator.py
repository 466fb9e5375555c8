"""The CUDA caching allocator, read by the probe: key stats, recorded history, NVML's per-process figure.

Everything here is CUDA-only and returns None (or does nothing) elsewhere;
every call is guarded, so a torch without one of these private APIs costs
the probe that figure and nothing more.  The pure reading of what is
recorded lives in ``allocator_timeline.py`` and ``allocator_trace.py``.

History (``torch.cuda.memory._record_memory_history``) records every
allocation and free with its Python stack, at about 2 µs each, into a ring
buffer of ``max_entries``; the probe turns it on at set-up and off once the
first explained steps are read, so what a user pays is bounded to those
steps.  Turning it off clears the buffer, so the snapshot is taken first.  If
the program records history itself, the probe reads it and leaves it on.
"""

from __future__ import annotations

import inspect
import os
import sys
from collections.abc import Mapping
from typing import Any, TypeAlias, TypedDict, cast

from shardtop.probe.allocating_code import MARKER_FUNCTION
from shardtop.probe.allocator_timeline import block_bytes
from shardtop.rundir.memory_figures import AllocatorStats

DEFAULT_MAX_ENTRIES = 100_000
"""Trace entries kept (each some hundred bytes of host memory plus its stack): set-up and about
two steps of a model of a few thousand modules."""


MemoryStats: TypeAlias = Mapping[str, object]
"""The caching allocator's stats as torch gives them: nested (``torch._C._cuda_memoryStats``:
``{"allocated_bytes": {"all": {"current": N}}}``) or flat (``torch.cuda.memory_stats``:
``{"allocated_bytes.all.current": N}``)."""


class MemorySnapshot(TypedDict, total=False):
    """``torch.cuda.memory._snapshot()``, whose shape torch documents there: the allocator's segments and, while
    it records, each device's trace.  Kept whole, as torch made it, for the snapshot files."""

    segments: list[Mapping[str, Any]]
    device_traces: list[list[Mapping[str, Any]]]


def allocator_stat(stats: MemoryStats, name: str, which: str = "current") -> int | None:
    """``name``'s figure over all pools (``allocated_bytes``; ``current`` or ``peak``), nested or flat."""
    nested = stats.get(name)
    value = nested.get("all", {}).get(which) if isinstance(nested, Mapping) else stats.get(f"{name}.all.{which}")
    return _count(value)


def _count(value: object) -> int | None:
    return int(value) if isinstance(value, (int, float)) else None


def allocator_stats(stats: MemoryStats) -> AllocatorStats | None:
    """The key numbers from ``torch._C._cuda_memoryStats`` (nested) or ``torch.cuda.memory_stats`` (flat)."""

    def stat(name: str, which: str = "current") -> int | None:
        return allocator_stat(stats, name, which)

    allocated, reserved = stat("allocated_bytes"), stat("reserved_bytes")
    if allocated is None or reserved is None:
        return None
    return AllocatorStats(
        allocated=allocated,
        reserved=reserved,
        active=stat("active_bytes"),
        inactive_split=stat("inactive_split_bytes"),
        peak_allocated=stat("allocated_bytes", "peak"),
        peak_reserved=stat("reserved_bytes", "peak"),
        num_alloc_retries=_count(stats.get("num_alloc_retries")),
        num_ooms=_count(stats.get("num_ooms")),
    )


def _torch() -> Any:
    torch = sys.modules.get("torch")
    if torch is None or not torch.cuda.is_available() or not torch.cuda.is_initialized():
        return None
    return torch


class AllocatorHistory:
    """The allocator's recorded history for one device: on, markers, snapshot, off."""

    def __init__(self, device_index: int, max_entries: int = DEFAULT_MAX_ENTRIES) -> None:
        self.device_index = device_index
        self.max_entries = max_entries
        self.ours = False
        """True when the probe turned recording on (and so may turn it off)."""
        self.error: str | None = None

    @property
    def recording(self) -> bool:
        torch = _torch()
        enabled = getattr(getattr(torch, "_C", None), "_cuda_isHistoryEnabled", None)
        try:
            return bool(enabled()) if enabled is not None else self.ours
        except Exception:  # noqa: BLE001
            return self.ours

    def start(self) -> bool:
        """Record allocations with their Python stacks; True if recording (ours or the program's)."""
        torch = _torch()
        if torch is None:
            return False
        if self.recording:
            return True
        record = getattr(torch.cuda.memory, "_record_memory_history", None)
        if record is None:
            return False
        kwargs: dict[str, object] = {"context": "alloc", "stacks": "python", "max_entries": self.max_entries}
        try:
            if "skip_actions" in inspect.signature(record).parameters:  # torch >= 2.8: halve the entries
                kwargs["skip_actions"] = ["free_completed", "segment_alloc", "segment_free", "snapshot"]
            record(enabled="all", **kwargs)
        except Exception as e:  # noqa: BLE001 - a torch without it: no trace, no harm
            self.error = str(e).split("\n", 1)[0]
            return False
        self.ours = True
        return True

    def stop(self) -> None:
        """Turn recording off if the probe turned it on (which clears what was recorded)."""
        torch = _torch()
        if torch is None or not self.ours:
            return
        self.ours = False
        try:
            torch.cuda.memory._record_memory_history(enabled=None)
        except Exception as e:  # noqa: BLE001
            self.error = str(e).split("\n", 1)[0]

    def mark(self) -> bool:
        """One tiny allocation from ``MARKER_FUNCTION``: it ties a census to a position in the trace."""
        torch = _torch()
        if torch is None or not self.ours and not self.recording:
            return False
        return _shardtop_trace_marker(torch, self.device_index)

    def snapshot(self) -> MemorySnapshot | None:
        """``torch.cuda.memory._snapshot()``: segments, blocks and the trace; None where unavailable."""
        return memory_snapshot()


def _shardtop_trace_marker(torch: Any, index: int) -> bool:  # the name is MARKER_FUNCTION
    try:
        marker = torch.empty(1, device=torch.device("cuda", index))
        del marker
        return True
    except Exception:  # noqa: BLE001 - even at an OOM's edge a marker must not raise
        return False


assert _shardtop_trace_marker.__name__ == MARKER_FUNCTION


def library_workspaces(index: int = 0) -> frozenset[int]:
    """The block sizes of cuBLAS's and cuBLASLt's workspaces in this process, as the running torch sizes
    them (``torch._C._cuda_getCublasWorkspaceSize`` and its cuBLASLt twin); empty off CUDA.

    A torch without a getter sizes the cuBLAS workspace from ``CUBLAS_WORKSPACE_CONFIG`` (``:KiB:count``
    pairs), else by its default: 32 MiB on compute capability 9 and later, 8.125 MiB before; and the
    cuBLASLt one from ``CUBLASLT_WORKSPACE_SIZE`` (KiB), else 1 MiB.  Measured on an H200 with torch
    2.11: a 32 MiB block per cuBLAS handle and a 1 MiB block made by ``getCUDABlasLtWorkspace``.
    """
    torch = _torch()
    if torch is None:
        return frozenset()

    def got(name: str) -> int:
        getter = getattr(torch._C, name, None)
        try:
            return int(getter()) if getter is not None else 0
        except Exception:  # noqa: BLE001
            return 0

    cublas = got("_cuda_getCublasWorkspaceSize")
    if not cublas:
        try:
            major = torch.cuda.get_device_capability(index)[0]
        except Exception:  # noqa: BLE001
            major = 0
        cublas = cublas_workspace_size(os.environ.get("CUBLAS_WORKSPACE_CONFIG"), major)
    cublaslt = got("_cuda_getCublasLtWorkspaceSize")
    cublaslt = cublaslt or cublaslt_workspace_size(os.environ.get("CUBLASLT_WORKSPACE_SIZE"))
    return frozenset(block_bytes(size, cuda=True) for size in (cublas, cublaslt) if size > 0)


def cublas_workspace_size(config: str | None, major: int) -> int:
    """cuBLAS's workspace bytes for ``CUBLAS_WORKSPACE_CONFIG`` (``:4096:8``: eight chunks of 4096 KiB)."""
    if config:
        parts = config.strip(":").split(":")
        try:
            pairs = [(int(parts[i]), int(parts[i + 1])) for i in range(0, len(parts) - 1, 2)]
        except ValueError:
            pairs = []
        if pairs:
            return sum(kib * 1024 * count for kib, count in pairs)
    return 4096 * 1024 * 8 if major >= 9 else 4096 * 1024 * 2 + 16 * 1024 * 8


def cublaslt_workspace_size(config: str | None) -> int:
    """cuBLASLt's workspace bytes for ``CUBLASLT_WORKSPACE_SIZE`` (KiB), else torch's default of 1 MiB."""
    try:
        return int(config) * 1024 if config and int(config) >= 0 else 1024 * 1024
    except ValueError:
        return 1024 * 1024


def memory_snapshot() -> MemorySnapshot | None:
    torch = _torch()
    if torch is None:
        return None
    try:
        return cast(MemorySnapshot, dict(torch.cuda.memory._snapshot()))
    except Exception:  # noqa: BLE001
        return None


# -- NVML: this process's memory on its GPU -------------------------------------------------


class ProcessMemory:
    """NVML's figure for this process on one CUDA device (context, workspaces, reserved memory).

    The NVML device is found by UUID (``CUDA_VISIBLE_DEVICES`` renumbers CUDA
    devices).  A container may show NVML host pids: then, if the device lists
    exactly one process, it is this one (it holds a context there).
    """

    def __init__(self, cuda_index: int) -> None:
        self.cuda_index = cuda_index
        self._handle: Any = None
        self._nvml: Any = None
        self._tried = False

    def used(self) -> int | None:
        if not self._resolve():
            return None
        nvml = self._nvml
        try:
            procs = nvml.nvmlDeviceGetComputeRunningProcesses(self._handle)
        except Exception:  # noqa: BLE001
            return None
        import os

        mine = [p for p in procs if p.pid == os.getpid()]
        if not mine and len(procs) == 1:
            mine = list(procs)
        used = getattr(mine[0], "usedGpuMemory", None) if mine else None
        return int(used) if isinstance(used, int) and used >= 0 else None

    def _resolve(self) -> bool:
        if self._tried:
            return self._handle is not None
        self._tried = True
        torch = _torch()
        if torch is None:
            return False
        from shardtop.gpus import nvml_or_none

        if nvml_or_none() is None:
            return False
        try:
            import pynvml

            self._nvml = pynvml
            uuid = str(getattr(torch.cuda.get_device_properties(self.cuda_index), "uuid", "") or "")
            if uuid:
                key = uuid if uuid.startswith(("GPU-", "MIG-")) else f"GPU-{uuid}"
                self._handle = pynvml.nvmlDeviceGetHandleByUUID(key)
            else:
                self._handle = pynvml.nvmlDeviceGetHandleByIndex(self.cuda_index)
        except Exception:  # noqa: BLE001 - no figure rather than a wrong device's
            self._handle = None
        return self._handle is not None
