"""NVML behind a small interface: how many GPUs, and what each holds now.

Used by the launcher (how many GPUs are there?), by each node's local rank 0
(NVML samples into the events) and by the TUI's GPU panel.  No torch here.
``nvidia-ml-py`` is imported as ``pynvml``.

The TUI also asks who the processes on the GPUs are (``HostProbe``): NVML
gives pids and their GPU memory, psutil the user, command, CPU and host RSS.
A pid NVML reports may be another user's (command hidden) or, inside a
container, not exist in our pid namespace at all; both are shown as such.
"""

from __future__ import annotations

import getpass
import threading
from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType
from typing import Any, Literal, Protocol, TypeVar, runtime_checkable

from shardtop.rundir.cluster import host_name
from shardtop.rundir.memory_figures import GpuMemory

T = TypeVar("T")


class GpuUnavailable(Exception):
    """No NVIDIA driver, or NVML failed to start; the message says which."""


class GpuSource(Protocol):
    """Anything that can report the GPUs: NVML, or recorded samples in tests."""

    def sample(self) -> list[GpuMemory]: ...


@dataclass(frozen=True)
class GpuProcessUse:
    """One process on one GPU, as NVML lists it."""

    gpu: int
    pid: int
    used: int | None
    """GPU memory it holds; None where NVML cannot say (some containers, MIG)."""


@runtime_checkable
class ProcessListing(Protocol):
    """A GPU source that also knows each process's GPU memory (NVML does)."""

    def process_uses(self) -> list[GpuProcessUse]: ...


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
        out: list[GpuMemory] = []
        uses: list[GpuProcessUse] = []
        for i, h in enumerate(self._handles):
            gpu, gpu_uses = self._sample_one(i, h, with_processes)
            out.append(gpu)
            uses.extend(gpu_uses)
        if with_processes:
            self._uses = uses
        return out

    def _sample_one(self, i: int, h: object, with_processes: bool) -> tuple[GpuMemory, list[GpuProcessUse]]:
        """GPU ``i``'s memory, utilisation, temperature and power, and its processes if asked."""
        n = self._nvml
        mem = n.nvmlDeviceGetMemoryInfo(h)
        util = _maybe(lambda: n.nvmlDeviceGetUtilizationRates(h).gpu, n)
        temp = _maybe(lambda: n.nvmlDeviceGetTemperature(h, n.NVML_TEMPERATURE_GPU), n)
        power = _maybe(lambda: n.nvmlDeviceGetPowerUsage(h) / 1000.0, n)
        pids: list[int] = []
        uses: list[GpuProcessUse] = []
        if with_processes:
            procs = _maybe(lambda: n.nvmlDeviceGetComputeRunningProcesses(h), n) or []
            pids = sorted({p.pid for p in procs})
            uses = [GpuProcessUse(gpu=i, pid=p.pid, used=_used_memory(p)) for p in procs]
        name, uuid = self._static[i]
        gpu = GpuMemory(
            index=i, name=name, uuid=uuid, used=int(mem.used), total=int(mem.total),
            util=util, temperature=temp, power_w=power, pids=pids,
        )
        return gpu, uses

    def process_uses(self) -> list[GpuProcessUse]:
        """Per-process GPU memory as of the last ``sample()`` (no second NVML round trip)."""
        return list(getattr(self, "_uses", []))


def _used_memory(proc: Any) -> int | None:
    used = getattr(proc, "usedGpuMemory", None)
    return int(used) if isinstance(used, int) and used >= 0 else None


def _maybe(fn: Callable[[], T], nvml: ModuleType) -> T | None:
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


def uses_from_pids(gpus: list[GpuMemory]) -> list[GpuProcessUse]:
    """Process uses from a sample's pid lists, for sources that give no per-process memory."""
    return [GpuProcessUse(gpu=g.index, pid=pid, used=None) for g in gpus for pid in g.pids]


Visibility = Literal["own", "other-user", "not-visible"]


@dataclass(frozen=True)
class GpuProcessInfo:
    """A process holding GPU memory, with what psutil could tell about it."""

    pid: int
    gpus: tuple[int, ...]
    gpu_memory: int | None
    visibility: Visibility
    """own, other-user, or not-visible (no such pid here: another pid namespace)."""
    user: str = ""
    command: str = ""
    cpu_percent: float | None = None
    host_rss: int | None = None


@dataclass(frozen=True)
class HostSample:
    """The machine itself: what to show where there are no GPUs."""

    cpu_percent: float
    cores: int
    memory_used: int
    memory_total: int


class HostProbe:
    """psutil behind the same kind of small interface as NVML.

    Keeps one ``psutil.Process`` per pid so ``cpu_percent`` measures the time
    since the previous sample instead of blocking.
    """

    def __init__(self, user: str | None = None) -> None:
        """``user``: whose processes count as one's own (default: whoever runs shardtop)."""
        import psutil

        self._psutil = psutil
        self._me = user or getpass.getuser()
        self._procs: dict[int, Any] = {}
        psutil.cpu_percent(None)

    @property
    def name(self) -> str:
        """This machine's host name, as its ranks write it on their events."""
        return host_name()

    def host(self) -> HostSample:
        p = self._psutil
        vm = p.virtual_memory()
        return HostSample(
            cpu_percent=float(p.cpu_percent(None)),
            cores=p.cpu_count() or 1,
            memory_used=int(vm.total - vm.available),
            memory_total=int(vm.total),
        )

    def describe(self, uses: list[GpuProcessUse]) -> list[GpuProcessInfo]:
        """One row per pid (summing its GPUs), sorted by GPU memory, never raising."""
        by_pid: dict[int, list[GpuProcessUse]] = {}
        for use in uses:
            by_pid.setdefault(use.pid, []).append(use)
        for gone in set(self._procs) - set(by_pid):
            del self._procs[gone]
        rows = [self._describe_one(pid, pid_uses) for pid, pid_uses in by_pid.items()]
        return sorted(rows, key=lambda r: (-(r.gpu_memory or 0), r.pid))

    def _describe_one(self, pid: int, uses: list[GpuProcessUse]) -> GpuProcessInfo:
        p = self._psutil
        gpus = tuple(sorted({u.gpu for u in uses}))
        known = [u.used for u in uses if u.used is not None]
        memory = sum(known) if known else None
        try:
            proc = self._procs.get(pid)
            if proc is None or not proc.is_running():
                proc = self._procs[pid] = p.Process(pid)
                proc.cpu_percent(None)
            with proc.oneshot():
                user = proc.username()
                rss = proc.memory_info().rss
                cpu = proc.cpu_percent(None)
        except (p.NoSuchProcess, p.ZombieProcess):
            self._procs.pop(pid, None)
            return GpuProcessInfo(pid, gpus, memory, "not-visible")
        except p.AccessDenied:
            return GpuProcessInfo(pid, gpus, memory, "other-user", user="?")
        visibility: Visibility = "own" if user == self._me else "other-user"
        try:
            command = " ".join(proc.cmdline()) or proc.name()
        except (p.AccessDenied, p.NoSuchProcess, p.ZombieProcess):
            command = ""
        return GpuProcessInfo(pid, gpus, memory, visibility, user, command, cpu, int(rss))
