"""This host's GPUs as NVML reads them (``shardtop.gpus``), as Prometheus samples.

Named as people already query them: nvitop-exporter's labels (``hostname``, ``index``, ``devicename``,
``uuid``, and ``pid`` for a GPU's processes) and DCGM's units in Prometheus's base units (bytes, percent,
degrees Celsius, watts).  A figure NVML does not give on a board has no series.
"""

from __future__ import annotations

from collections.abc import Sequence

from shardtop.export.exposition import Gauge, Sample, labels, sample
from shardtop.gpus import GpuProcessUse, GpuSource, ProcessListing, uses_from_pids
from shardtop.rundir.memory_figures import GpuMemory

GPU_USED = Gauge("shardtop_gpu_memory_used_bytes", "GPU memory in use, as NVML reads it.")
GPU_TOTAL = Gauge("shardtop_gpu_memory_total_bytes", "GPU memory in all, as NVML reads it.")
GPU_UTILIZATION = Gauge("shardtop_gpu_utilization_percent", "GPU utilization over NVML's last sample period, in %.")
GPU_TEMPERATURE = Gauge("shardtop_gpu_temperature_celsius", "GPU temperature, in degrees Celsius.")
GPU_POWER = Gauge("shardtop_gpu_power_usage_watts", "GPU power draw, in watts.")
GPU_PROCESS = Gauge("shardtop_gpu_process_info", "A process on the GPU, as NVML lists it (always 1).")
GPU_PROCESS_USED = Gauge("shardtop_gpu_process_memory_used_bytes", "GPU memory the process holds, as NVML reads it.")


def gpu_samples(host: str, gpus: Sequence[GpuMemory], uses: Sequence[GpuProcessUse]) -> list[Sample | None]:
    """Every GPU's series, then every process's."""
    out: list[Sample | None] = []
    by_index = {}
    for g in gpus:
        base = labels(hostname=host, index=g.index, devicename=g.name, uuid=g.uuid)
        by_index[g.index] = labels(hostname=host, index=g.index, uuid=g.uuid)
        out += [
            sample(GPU_USED, g.used, base),
            sample(GPU_TOTAL, g.total, base),
            sample(GPU_UTILIZATION, g.util, base),
            sample(GPU_TEMPERATURE, g.temperature, base),
            sample(GPU_POWER, g.power_w, base),
        ]
    for use in uses:
        base = by_index.get(use.gpu, labels(hostname=host, index=use.gpu)) + labels(pid=use.pid)
        out += [sample(GPU_PROCESS, 1, base), sample(GPU_PROCESS_USED, use.used, base)]
    return out


def read_gpus(source: GpuSource) -> tuple[list[GpuMemory], list[GpuProcessUse]]:
    """One NVML reading: the GPUs, and each process's memory where the source knows it."""
    gpus = source.sample()
    uses = source.process_uses() if isinstance(source, ProcessListing) else uses_from_pids(gpus)
    return gpus, uses
