"""Run a Python program with NVML answering from a recording, on a machine without an NVIDIA driver.

    python bench/recorded_nvml.py SAMPLES.json -m nvitop --interval 1
    python bench/recorded_nvml.py SAMPLES.json -m shardtop

``SAMPLES.json`` is written by ``write_samples`` (``bench_ssh.py`` does it).

NVML is the only thing replaced: ``pynvml`` (nvidia-ml-py, which both shardtop
and nvitop call) answers with the GPU samples shardtop's probe recorded on two
H200s during story 2's set-up (``tests/fixtures/runs/h200x2``: memory climbing
to 17 GiB per GPU, utilisation, temperature and power as NVML read them), one
sample per second of wall time, then around again.  Everything else is real:
psutil, the terminal, each program's own drawing.  ``pids`` puts live
processes (the benchmark's stand-ins for the ranks) where the recording has
the ranks' pids, so both programs find a process behind each GPU.  The file
is plain JSON so that reading it costs both programs' first frames nothing
worth counting.

What NVML would answer and the recording does not hold (clocks, fans, ECC,
PCIe, driver version...) raises ``NVMLError_NotSupported``, as NVML itself does
for fields a board lacks; both programs show those as not available.
"""

from __future__ import annotations

import json
import runpy
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
RECORDING = "h200x2/zero3-linear"
SECONDS_PER_SAMPLE = 1.0


def write_samples(path: Path, pids: list[int]) -> Path:
    """The recorded samples as JSON, the ranks' pids replaced by ``pids`` (in rank order)."""
    sys.path.insert(0, str(ROOT))
    import msgspec

    from tests.support.recorded import nvml_samples

    samples = nvml_samples(RECORDING)
    recorded = sorted({p for sample in samples for g in sample for p in g.pids})
    swap = dict(zip(recorded, pids, strict=False))
    plain = [[{**msgspec.structs.asdict(g), "pids": [swap.get(p, p) for p in g.pids]} for g in s] for s in samples]
    path.write_text(json.dumps(plain))
    return path


def install(samples: list[list[dict[str, Any]]], nvitop: bool) -> None:
    """Make ``pynvml`` answer from ``samples``; every call this does not know is NOT_SUPPORTED."""
    import pynvml

    started = time.monotonic()

    def now() -> list[Any]:
        return samples[int((time.monotonic() - started) / SECONDS_PER_SAMPLE) % len(samples)]

    def not_supported(*_args: Any, **_kwargs: Any) -> Any:
        raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)

    def gpu(handle: Any) -> Any:
        return SimpleNamespace(**now()[handle.index])

    def memory(handle: Any, version: Any = None) -> Any:
        g = gpu(handle)
        return SimpleNamespace(total=g.total, used=g.used, free=g.total - g.used, reserved=0, version=version)

    def processes(handle: Any) -> list[Any]:
        g = gpu(handle)
        share = g.used // max(1, len(g.pids))
        return [SimpleNamespace(pid=p, usedGpuMemory=share, gpuInstanceId=0xFFFFFFFF, computeInstanceId=0xFFFFFFFF)
                for p in g.pids]

    def temperature(handle: Any, *_args: Any) -> int:
        return int(gpu(handle).temperature)

    count = len(samples[0])
    answers = {
        "nvmlInit": lambda: None,
        "nvmlInitWithFlags": lambda flags=0: None,
        "nvmlShutdown": lambda: None,
        "nvmlDeviceGetCount": lambda: count,
        "nvmlDeviceGetHandleByIndex": lambda i: SimpleNamespace(index=i),
        "nvmlDeviceGetIndex": lambda h: h.index,
        "nvmlDeviceGetName": lambda h: gpu(h).name,
        "nvmlDeviceGetUUID": lambda h: gpu(h).uuid,
        "nvmlDeviceGetMemoryInfo": memory,
        "nvmlDeviceGetUtilizationRates": lambda h: SimpleNamespace(gpu=int(gpu(h).util), memory=0),
        "nvmlDeviceGetTemperature": temperature,
        "nvmlDeviceGetTemperatureV": temperature,
        "nvmlDeviceGetPowerUsage": lambda h: int(gpu(h).power_w * 1000),
        "nvmlDeviceGetPowerManagementLimit": lambda h: 700_000,
        "nvmlDeviceGetComputeRunningProcesses": processes,
        "nvmlDeviceGetComputeRunningProcesses_v2": processes,
        "nvmlDeviceGetComputeRunningProcesses_v3": processes,
        "nvmlDeviceGetGraphicsRunningProcesses": lambda h: [],
        "nvmlDeviceGetMPSComputeRunningProcesses": lambda h: [],
        "nvmlDeviceIsMigDeviceHandle": lambda h: False,
        "nvmlDeviceGetMigMode": lambda h: (0, 0),
    }
    for name in dir(pynvml):
        if name.startswith("nvml") and callable(getattr(pynvml, name)) and name not in ("nvmlExceptionClass",):
            setattr(pynvml, name, answers.get(name, not_supported))
    pynvml._nvmlGetFunctionPointer = not_supported  # what nvitop's own wrappers call into
    if not nvitop:
        return
    from nvitop.api import (
        libnvml,  # it keeps copies of pynvml's functions, and wraps a few itself
    )

    for name, answer in answers.items():
        if name not in ("nvmlInit", "nvmlInitWithFlags", "nvmlShutdown"):
            setattr(libnvml, name, answer)


def main() -> None:
    args = sys.argv[1:]
    if len(args) < 3 or args[1] != "-m":
        raise SystemExit("usage: recorded_nvml.py SAMPLES.json -m MODULE [ARGS...]")
    samples = json.loads(Path(args[0]).read_text())
    install(samples, nvitop=args[2].startswith("nvitop"))
    sys.argv = [args[2], *args[3:]]
    runpy.run_module(args[2], run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
