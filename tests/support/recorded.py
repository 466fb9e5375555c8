"""Recorded runs and recorded hardware, for the TUI tests and the screenshots.

Runs are the real recordings committed under ``tests/fixtures/runs/``:
``h200/`` (every preset on one NVIDIA H200, story 2 under a 15 GiB cap) and
``cpu-6ranks/`` (story 2 on 6 gloo CPU processes), ``cpu-2hosts/`` (a user's
own FSDP2 script on two hosts of two CPU ranks each), ``cpu-rehearsal/``
(``fsdp2-mlp`` and story 2 rehearsed as ranks 0 and 3 of 4, one CPU process at a
time), ``cpu-over-time/`` (a user's loop whose memory grows every step, and two gloo ranks, one of them
stalled in a collective its peer skipped), ``cpu-offload/`` (story 2 fixed with DeepSpeed's optimizer
offload on 2 gloo CPU processes), and under
``tests/tui/fixtures/runs/`` (``fsdp2-mlp`` on 2 CPU processes), ``h200-split/`` (the
presets on one H200 with each rank's memory split by kind).  They are
named here ``machine/preset`` (or ``machine/program`` for a user's own job):
``h200/zero3-linear``, ``cpu-6ranks/zero3-linear``, ``cpu/fsdp2-mlp``,
``cpu-2hosts/fsdp2_train``, ``cpu-rehearsal/fsdp2-mlp``.

NVML's answers for the GPU panel are the samples the probe recorded inside those
runs (the ``gpus`` of their Memory and Oom events).  The one thing made up is
the machine with eight H200s (``eight_h200s``): no 8-GPU machine was at hand,
so its GPUs are the recorded H200 sample with other figures.  psutil's answers
are recorded as the host and the processes behind the GPU pids.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Sequence
from pathlib import Path

import msgspec

from shardtop.gpus import GpuProcessInfo, GpuProcessUse, GpuUnavailable, HostSample
from shardtop.rundir.event_files import read_all
from shardtop.rundir.events import Memory, Oom
from shardtop.rundir.liveness import process_start_time
from shardtop.rundir.memory_figures import GpuMemory

# built runs, importable from here for bench/, tests/engines/test_report.py and tests/engines/test_diagnose.py
from tests.support.built_runs import PIDS, T0, big_tree_run, fsdp2_cpu_run, zero3_oom_run  # noqa: F401

GIB = 1024**3
MACHINES = {
    "h200": Path(__file__).resolve().parent.parent / "fixtures" / "runs" / "h200",
    "h200x2": Path(__file__).resolve().parent.parent / "fixtures" / "runs" / "h200x2",
    "h200-split": Path(__file__).resolve().parent.parent / "fixtures" / "runs" / "h200-split",
    "cpu-6ranks": Path(__file__).resolve().parent.parent / "fixtures" / "runs" / "cpu-6ranks",
    "cpu": Path(__file__).resolve().parent.parent / "tui" / "fixtures" / "runs",
    "cpu-2hosts": Path(__file__).resolve().parent.parent / "fixtures" / "runs" / "cpu-2hosts",
    "cpu-rehearsal": Path(__file__).resolve().parent.parent / "fixtures" / "runs" / "cpu-rehearsal",
    "cpu-over-time": Path(__file__).resolve().parent.parent / "fixtures" / "runs" / "cpu-over-time",
    "h200-over-time": Path(__file__).resolve().parent.parent / "fixtures" / "runs" / "h200-over-time",
    "cpu-offload": Path(__file__).resolve().parent.parent / "fixtures" / "runs" / "cpu-offload",
}
"""Where each machine's recordings are."""
STORY2_OOM = "h200/zero3-linear"
"""Story 2 as asked, on the H200: a real CUDA OOM in model.net.15330 under a 15 GiB cap."""


def recorded_run(name: str) -> Path:
    """The committed run directory of ``machine/preset`` (``h200/zero3-linear``)."""
    machine, _, preset = name.partition("/")
    for meta in sorted(MACHINES[machine].glob("*/run.json")):
        recorded = json.loads(meta.read_text())
        if preset in (recorded.get("preset"), recorded.get("config", {}).get("program")):
            return meta.parent
    raise LookupError(f"no recorded {preset} run under {MACHINES[machine]}")


def copy_runs(dest: Path, *names: str) -> dict[str, Path]:
    """Copies of the named recordings under ``dest`` (a test may write into a run directory)."""
    dest.mkdir(parents=True, exist_ok=True, mode=0o700)
    out = {}
    for name in names:
        source = recorded_run(name)
        target = dest / source.name
        if not target.exists():
            shutil.copytree(source, target)
        out[name] = target
    return out


def live_copy(dest: Path, name: str) -> Path:
    """A copy of a recording made live again: no exit record, the calling process as the run's own."""
    run = copy_runs(dest, name)[name]
    (run / "exit.json").unlink(missing_ok=True)
    meta = json.loads((run / "run.json").read_text())
    meta.update(pid=os.getpid(), pid_started=process_start_time(os.getpid()))
    (run / "run.json").write_text(json.dumps(meta))
    return run


ALL_RUNS = (
    "h200/zero3-linear",
    "h200/zero3-linear-fixed",
    "h200/fsdp-not-sharding",
    "h200/fsdp-auto-wrap",
    "h200/ddp-baseline",
    "h200/manual-placement",
    "h200/fsdp2-mlp",
    "h200x2/zero3-linear",
    "h200x2/zero3-linear-fixed",
    "cpu-6ranks/zero3-linear",
    "cpu-6ranks/zero3-linear-fixed",
    "cpu/fsdp2-mlp",
)


# -- recorded hardware ------------------------------------------------------------------


def nvml_samples(name: str = STORY2_OOM) -> list[list[GpuMemory]]:
    """What NVML said during a recorded run, in order: the ``gpus`` of its Memory and Oom events."""
    events, _skipped = read_all(recorded_run(name) / "events")
    return [list(e.gpus) for e in events if isinstance(e, Memory | Oom) and e.gpus]


RECORDED_HOST_NAME = "vm"
"""The host name on the recorded runs' events (the H200 machine and the CPU machine alike)."""


class RecordedGpus:
    """NVML's answers, recorded: ``sample()`` replays them, then repeats the last."""

    def __init__(self, samples: Sequence[list[GpuMemory]]) -> None:
        self.samples = list(samples)
        self.calls = 0

    def sample(self) -> list[GpuMemory]:
        sample = self.samples[min(self.calls, len(self.samples) - 1)]
        self.calls += 1
        return sample


def recorded_h200(ramp: bool = False) -> RecordedGpus:
    """The H200 as story 2's run saw it: at the OOM, or (``ramp``) every sample on the way there."""
    samples = nvml_samples()
    return RecordedGpus(samples if ramp else samples[-1:])


class RecordedHost:
    """psutil's answers, recorded: the host and the processes behind the GPU pids.

    ``name``: the machine's host name; the recordings' ranks wrote ``vm``.
    """

    def __init__(
        self, host: HostSample, processes: dict[int, GpuProcessInfo] | None = None, name: str = RECORDED_HOST_NAME
    ) -> None:
        self._host = host
        self._processes = processes or {}
        self.name = name

    def host(self) -> HostSample:
        return self._host

    def describe(self, uses: list[GpuProcessUse]) -> list[GpuProcessInfo]:
        out = []
        for pid in dict.fromkeys(u.pid for u in uses):
            gpus = tuple(sorted({u.gpu for u in uses if u.pid == pid}))
            out.append(self._processes.get(pid, GpuProcessInfo(pid, gpus, None, "not-visible")))
        return out


class NoDriver:
    """NVML's answer on a machine without the NVIDIA driver, recorded."""

    def sample(self) -> list[GpuMemory]:
        raise GpuUnavailable("no NVIDIA driver: NVML Shared Library Not Found")


LOGIN_NODE = HostSample(cpu_percent=3.0, cores=8, memory_used=6 * GIB, memory_total=31 * GIB)
"""A login node: no GPU, 8 cores (its host name is given as ``login-1``)."""

H200_HOST = HostSample(cpu_percent=4.0, cores=16, memory_used=21 * GIB, memory_total=126 * GIB)
"""The H200 machine the fixtures were recorded on (16 cores, 126 GiB), during story 2's set-up."""


def h200_processes() -> dict[int, GpuProcessInfo]:
    """psutil's view of story 2's rank on the H200: pid, GPU memory and RSS from the recording."""
    last = nvml_samples()[-1][0]
    pid = last.pids[0]
    return {
        pid: GpuProcessInfo(
            pid, (0,), last.used, "own", "root", "python -m shardtop.runner.rank zero3-linear", 99.0, 20_601_397_248
        )
    }


# -- eight H200s (story 2 asked about six GPUs; no 8-GPU machine was at hand) ----------------

EIGHT_GPU_HOST = HostSample(cpu_percent=9.0, cores=192, memory_used=151 * GIB, memory_total=2015 * GIB)
TRAINER_PIDS = tuple(range(4_194_401, 4_194_407))
"""The six ranks of a training job; above Linux's largest pid (2**22), so no live process has them."""
OTHER_USER_PID = 4_194_431
BUSY_GIB = (14.2, 14.6, 14.9, 14.4, 15.1, 14.7)
"""GPUs 0-5: one rank each, as story 2's six ranks would be with the model built whole."""
IDLE_GIB = 0.55
OTHER_USER_GIB = 38.2


def eight_h200s(ramp: bool = False) -> RecordedGpus:
    """Eight H200s: 0-5 busy with one rank each, 6 idle, 7 used by another user.

    Every GPU is the recorded H200 sample (name, total) with its own index, pids and
    figures; ``ramp`` replays story 2's recorded fill, scaled to each GPU, for the sparklines.
    """
    recorded = nvml_samples("h200/zero3-linear-fixed")
    base = recorded[-1][0]
    fills = [s[0].used / base.used for s in recorded] if ramp else [1.0]
    samples = []
    for fill in fills:
        gpus = [
            msgspec.structs.replace(
                base,
                index=i,
                uuid=f"GPU-8h200-{i}",
                used=int(gib * GIB * fill),
                util=round(97 * fill) - i % 3,
                temperature=58 + i,
                power_w=610.0 - 11 * i,
                pids=[TRAINER_PIDS[i]],
            )
            for i, gib in enumerate(BUSY_GIB)
        ]
        gpus.append(
            msgspec.structs.replace(
                base, index=6, uuid="GPU-8h200-6", used=int(IDLE_GIB * GIB), util=0, temperature=31, power_w=74.0,
                pids=[],
            )
        )
        gpus.append(
            msgspec.structs.replace(
                base,
                index=7,
                uuid="GPU-8h200-7",
                used=int(OTHER_USER_GIB * GIB),
                util=64,
                temperature=49,
                power_w=402.0,
                pids=[OTHER_USER_PID],
            )
        )
        samples.append(gpus)
    return RecordedGpus(samples)


def eight_h200_processes() -> dict[int, GpuProcessInfo]:
    """The six ranks (one user's ``train.py``) and another user's process psutil cannot read."""
    command = "python train.py --devices 6 --strategy deepspeed_stage_3"
    ranks = {
        pid: GpuProcessInfo(pid, (i,), int(BUSY_GIB[i] * GIB) - 540 * 2**20, "own", "trainer", command, 99.0, 20 * GIB)
        for i, pid in enumerate(TRAINER_PIDS)
    }
    other = GpuProcessInfo(OTHER_USER_PID, (7,), int((OTHER_USER_GIB - 0.5) * GIB), "other-user", "alice")
    return {**ranks, OTHER_USER_PID: other}
