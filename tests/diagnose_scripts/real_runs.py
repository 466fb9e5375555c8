"""Real CPU runs for the diagnosis and report tests, each made once per test session.

``preset_run`` launches a preset through the real CLI (``shardtop launch
--headless``); ``script_run`` starts a script of this directory once per rank
with torch.distributed's environment, as torchrun would; ``lightning_run``
starts a Lightning script once and lets Lightning start its ranks.  Every run
writes into a runs directory of its own, found afterwards like any run.  Runs
are cached by their arguments, so ``test_diagnose.py`` and ``test_report.py``
share them.

Exit codes are kept for the messages but never asserted here: raw gloo runs
abort at interpreter exit now and then (DESIGN.md).
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from shardtop.rundir.run_directory import RunDirectory, list_runs
from tests.support.cli import shardtop
from tests.support.distributed import free_port

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = Path(__file__).resolve().parent

CPU_ENV = {"CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": "1", "DS_ACCELERATOR": "cpu", "PYTHONUNBUFFERED": "1"}
"""Every run on CPU processes, one thread each (CI has 2 cores)."""

DISTRIBUTED_VARS = (
    "RANK",
    "LOCAL_RANK",
    "WORLD_SIZE",
    "LOCAL_WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
    "GROUP_RANK",
    "TORCHELASTIC_RUN_ID",
    "SHARDTOP_RUN_DIR",
)


@dataclass(frozen=True)
class RealRun:
    path: Path
    returncode: int
    output: str
    """What the launcher (or the ranks) printed, for assertion messages."""

    @property
    def run(self) -> RunDirectory:
        return RunDirectory(self.path)

    def describe(self) -> str:
        return f"run {self.path} (exit {self.returncode}):\n{self.output[-4000:]}"


_runs: dict[tuple[Any, ...], RealRun] = {}


def _base_env(runs_dir: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in DISTRIBUTED_VARS}
    pythonpath = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
    return {**env, **CPU_ENV, "PYTHONPATH": pythonpath, "SHARDTOP_RUNS_DIR": str(runs_dir)}


def _only_run(runs_dir: Path, returncode: int, output: str) -> RealRun:
    runs = list_runs(runs_dir)
    if len(runs) != 1:
        raise AssertionError(f"expected one run under {runs_dir}, found {len(runs)}:\n{output[-4000:]}")
    return RealRun(runs[0].path, returncode, output)


_numbers = itertools.count()
"""Run directories' numbers: ``next`` is atomic, so runs made at the same time never share one."""


def _fresh(base: Path, name: str) -> Path:
    path = base / f"{next(_numbers):02d}-{name}"
    path.mkdir(parents=True)
    return path


def preset_run(base: Path, preset: str, *settings: str, timeout: float = 300) -> RealRun:
    """``shardtop launch preset=NAME accelerator=cpu --headless SETTINGS``, once per session."""
    key = ("preset", preset, settings)
    if key not in _runs:
        runs_dir = _fresh(base, preset)
        done = shardtop(
            "launch",
            f"preset={preset}",
            "accelerator=cpu",
            "--headless",
            *settings,
            runs_dir=runs_dir,
            timeout=timeout,
            env=CPU_ENV,
        )
        _runs[key] = _only_run(runs_dir, done.returncode, done.stdout + done.stderr)
    return _runs[key]


def script_run(base: Path, script: str, world_size: int, *args: str, timeout: float = 300) -> RealRun:
    """``python tests/diagnose_scripts/SCRIPT ARGS`` on ``world_size`` ranks, as torchrun starts them."""
    key = ("script", script, world_size, args)
    if key not in _runs:
        runs_dir = _fresh(base, Path(script).stem)
        code, output = _run_ranks(runs_dir, script, world_size, args, timeout)
        _runs[key] = _only_run(runs_dir, code, output)
    return _runs[key]


def scenario_runs(
    base: Path,
    script: str,
    world_size: int,
    scenarios: tuple[str, ...],
    *args: str,
    timeout: float = 300,
    preexec: Callable[[], None] | None = None,
) -> dict[str, RealRun]:
    """``SCRIPT SCENARIO... ARGS`` on ``world_size`` ranks: one set of processes runs every
    scenario, each recording a run of its own (named after it).  ``preexec`` runs in each rank's
    process before the script (e.g. to enter a memory cgroup)."""
    key = ("scenarios", script, world_size, scenarios, args)
    if key not in _runs:
        runs_dir = _fresh(base, Path(script).stem)
        code, output = _run_ranks(runs_dir, script, world_size, (*scenarios, *args), timeout, preexec)
        by_name = {_program(r): r for r in list_runs(runs_dir)}
        missing = [s for s in scenarios if s not in by_name]
        if missing:
            raise AssertionError(f"no run recorded for {missing} under {runs_dir}:\n{output[-4000:]}")
        for name in scenarios:
            _runs[(*key, name)] = RealRun(by_name[name].path, code, output)
        _runs[key] = _runs[(*key, scenarios[0])]
    return {name: _runs[(*key, name)] for name in scenarios}


def _program(run: RunDirectory) -> str:
    return run.read_meta().config.program


def _run_ranks(
    runs_dir: Path,
    script: str,
    world_size: int,
    args: tuple[str, ...],
    timeout: float,
    preexec: Callable[[], None] | None = None,
) -> tuple[int, str]:
    """Start the script once per rank, as torchrun would; (the worst exit code, every rank's output)."""
    env = _base_env(runs_dir)
    port = str(free_port())
    procs = []
    for rank in range(world_size):
        rank_env = {
            **env,
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": port,
            "RANK": str(rank),
            "LOCAL_RANK": str(rank),
            "WORLD_SIZE": str(world_size),
            "LOCAL_WORLD_SIZE": str(world_size),
        }
        procs.append(
            subprocess.Popen(
                [sys.executable, str(SCRIPTS / script), *args],
                env=rank_env,
                cwd=ROOT,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
                preexec_fn=preexec,
            )
        )
    outputs, codes = [], []
    for rank, proc in enumerate(procs):
        try:
            out, _ = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            for p in procs:
                p.kill()
            out, _ = proc.communicate()
        outputs.append(f"--- rank {rank} ---\n{out[-3000:]}")
        codes.append(proc.returncode)
    return next((c for c in codes if c), 0), "\n".join(outputs)


def lightning_run(base: Path, script: str, *args: str, timeout: float = 300) -> RealRun:
    """``python tests/diagnose_scripts/SCRIPT ARGS`` once: Lightning starts the other ranks."""
    key = ("lightning", script, args)
    if key not in _runs:
        runs_dir = _fresh(base, Path(script).stem)
        done = subprocess.run(
            [sys.executable, str(SCRIPTS / script), *args],
            env=_base_env(runs_dir),
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        _runs[key] = _only_run(runs_dir, done.returncode, done.stdout + done.stderr)
    return _runs[key]


def killed_before_the_probe(base: Path, timeout: float = 120) -> RealRun:
    """A preset run whose ranks are killed (SIGKILL) as soon as they exist, before the probe comes up."""
    key = ("killed-before-probe",)
    if key not in _runs:
        runs_dir = _fresh(base, "killed-before-probe")
        env = {**os.environ, **CPU_ENV, "SHARDTOP_RUNS_DIR": str(runs_dir)}
        launcher = subprocess.Popen(
            [sys.executable, "-m", "shardtop", "launch", "preset=fsdp2-mlp", "accelerator=cpu", "--headless"],
            env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )
        deadline = time.monotonic() + timeout
        killed: set[int] = set()
        while len(killed) < 2 and time.monotonic() < deadline:
            for run in list_runs(runs_dir):
                for entry in run.read_meta().rank_pids:
                    if entry.pid not in killed:
                        with contextlib.suppress(ProcessLookupError):
                            os.kill(entry.pid, signal.SIGKILL)
                        killed.add(entry.pid)
            time.sleep(0.01)
        out, _ = launcher.communicate(timeout=timeout)
        _runs[key] = _only_run(runs_dir, launcher.returncode, out)
    return _runs[key]


def report_json(real: RealRun) -> dict[str, Any]:
    """``shardtop report RUN --format json``, through the real CLI."""
    done = shardtop("report", str(real.path), "--format", "json", runs_dir=real.path.parent, timeout=120)
    assert done.returncode == 0, done.stderr + "\n" + real.describe()
    return json.loads(done.stdout)


def codes(report: dict[str, Any]) -> list[str]:
    return [f["code"] for f in report["findings"]]


_base: list[Path] = []


def runs_base(factory: Any) -> Path:
    """One directory for every real run of the session (``factory``: pytest's ``tmp_path_factory``)."""
    if not _base:
        _base.append(factory.mktemp("real-runs"))
    return _base[0]


STORIES: dict[str, Any] = {
    # the presets, as a user launches them (CPU: 2 gloo processes; manual-placement: 1)
    "fsdp-not-sharding": lambda base: preset_run(base, "fsdp-not-sharding", "max_steps=2"),
    "fsdp-auto-wrap": lambda base: preset_run(base, "fsdp-auto-wrap", "max_steps=2"),
    "zero3-linear": lambda base: preset_run(base, "zero3-linear", "max_steps=2", "model.n_layers=16"),
    "zero3-linear-fixed": lambda base: preset_run(base, "zero3-linear-fixed", "max_steps=2", "model.n_layers=16"),
    "zero3-linear-fixed-offloaded": lambda base: preset_run(
        base, "zero3-linear-fixed", "max_steps=2", "model.n_layers=16", "zero.offload_optimizer=cpu",
        "zero.offload_param=cpu"
    ),
    "zero3-linear-fixed-optimizer-offloaded": lambda base: preset_run(
        base, "zero3-linear-fixed", "max_steps=2", "model.n_layers=16", "zero.offload_optimizer=cpu"
    ),
    "fsdp2-mlp": lambda base: preset_run(base, "fsdp2-mlp", "max_steps=2"),
    "ddp-baseline": lambda base: preset_run(base, "ddp-baseline", "max_steps=2"),
    "manual-placement": lambda base: preset_run(base, "manual-placement", "max_steps=2"),
    # story 2 on one rank, capped: ZeRO-3 partitions nothing, and set-up runs out of memory
    "zero3-one-rank-capped": lambda base: preset_run(
        base, "zero3-linear", "devices=1", "gpu_mem_limit=1GiB", "max_steps=2", "model.n_layers=16"
    ),
    # user scripts for what no preset shows
    "fsdp1-no-wrap-policy": lambda base: script_run(base, "fsdp1_no_wrap_policy.py", 2),
    "fsdp2-default-mesh": lambda base: lightning_run(base, "fsdp2_default_mesh.py", "--devices", "2"),
    "pipeline-split": lambda base: script_run(base, "pipeline_split.py", 2),
    "zero3-built-whole": lambda base: script_run(base, "zero3_built_whole.py", 2),
    # both ranks killed the moment they exist: the run records nothing
    "killed-before-probe": killed_before_the_probe,
}
"""Every real run the diagnosis and report tests read, by name."""


def story(base: Path, name: str) -> RealRun:
    return STORIES[name](base)
