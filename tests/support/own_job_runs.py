"""Run a user's own command under the real ``shardtop run``, and read back what it recorded.

The commands are the users' own (``tests/own_scripts/`` import nothing of
shardtop); every process runs on CPU, one thread each (CI has 2 cores).
"""

from __future__ import annotations

import json
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from shardtop.rundir.event_files import read_all
from shardtop.rundir.events import AnyEvent
from shardtop.rundir.run_directory import RunDirectory, list_runs
from tests.support.cli import ROOT, shardtop

SCRIPTS = ROOT / "tests" / "own_scripts"

CPU_ENV = {"CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": "1", "DS_ACCELERATOR": "cpu", "PYTHONUNBUFFERED": "1"}

LAUNCHER_VARS = (
    "RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "GROUP_RANK",
    "TORCHELASTIC_RUN_ID", "SHARDTOP_RUN_DIR", "SHARDTOP_DISABLE", "SHARDTOP_INJECT",
    "SLURM_JOB_ID", "SLURM_STEP_ID", "SLURMD_NODENAME",
)
"""What a launcher around the tests may have set: a user's shell starts without them."""

GLOO_TEARDOWN_ABORT = "terminate called without an active exception"
"""Raw gloo runs abort at interpreter exit now and then, with or without shardtop: why shardtop's own ranks
leave with ``os._exit`` (``shardtop/runner/rank.py``) and ``tests/own_scripts/fsdp2_train.py`` has ``--os-exit``."""


def user_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in LAUNCHER_VARS}
    pythonpath = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
    return {**env, **CPU_ENV, "PYTHONPATH": pythonpath, **extra}


@dataclass(frozen=True)
class OwnRun:
    """One ``shardtop run --headless`` and what it left."""

    code: int
    output: str
    run: RunDirectory

    def events(self) -> list[AnyEvent]:
        return read_all(self.run.events_dir)[0]

    def command_log(self) -> str:
        return "\n".join(p.read_text(errors="replace") for p in sorted(self.run.logs_dir.glob("command-*.log")))

    def report(self, runs_dir: Path) -> dict[str, Any]:
        done = shardtop("report", str(self.run.path), "--format", "json", runs_dir=runs_dir, env=user_env())
        assert done.returncode == 0, done.stderr[-3000:]
        return json.loads(done.stdout)

    def describe(self) -> str:
        return (
            f"exit {self.code}\n--- shardtop run ---\n{self.output[-3000:]}\n"
            f"--- command ---\n{self.command_log()[-4000:]}"
        )


def run_own(
    runs_dir: Path, *command: str, options: tuple[str, ...] = (), env: dict[str, str] | None = None,
    timeout: float = 300,
) -> OwnRun:
    """``shardtop run --headless OPTIONS -- COMMAND`` from the repository root, as a user types it."""
    done = shardtop("run", "--headless", *options, "--", *command, runs_dir=runs_dir, timeout=timeout,
                    env=user_env(**(env or {})))
    run_dir = next((options[i + 1] for i, o in enumerate(options) if o == "--run-dir"), None)
    run_dir = run_dir or (env or {}).get("SHARDTOP_RUN_DIR")
    if run_dir:
        run = RunDirectory(Path(run_dir))
    else:
        runs = list_runs(runs_dir)
        assert len(runs) == 1, f"expected one run under {runs_dir}, found {len(runs)}:\n{done.stdout}{done.stderr}"
        run = runs[0]
    return OwnRun(done.returncode, done.stdout + done.stderr, run)


def command_pid(run: OwnRun) -> int:
    """The pid of the command as the supervisor started it (the launcher, for torchrun or deepspeed)."""
    for line in run.command_log().splitlines():
        if line.startswith("shardtop: started ") and "(pid " in line:
            return int(line.split("(pid ", 1)[1].split(")", 1)[0])
    raise AssertionError(f"no start line in the command log:\n{run.describe()}")


def cli(*args: str, runs_dir: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return shardtop(*args, runs_dir=runs_dir, env=user_env(**(env or {})))
