"""A framework's command run as its user runs it: alone, under ``shardtop run``, ``rehearse`` and ``plan``.

Every command runs in the framework's environment (its ``bin/`` first on
PATH, as after ``activate``), on CPU processes (no GPU is visible, one thread
each), offline (nothing reaches a model hub), from a working directory of its
own, and the ``shardtop`` it is run under is the one installed in that
environment.  What a user reads afterwards is read the same way here: the
command's output, ``shardtop report RUN --format json`` and ``shardtop plan
--format json``.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

from tests.frameworks.environments import Environment

RUN_TIMEOUT = 600
OFFLINE_CPU = {
    "CUDA_VISIBLE_DEVICES": "",
    "OMP_NUM_THREADS": "1",
    "PYTHONUNBUFFERED": "1",
    "HF_HUB_OFFLINE": "1",
    "HF_DATASETS_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "TOKENIZERS_PARALLELISM": "false",
    "WANDB_MODE": "disabled",
}
NOT_A_USERS_SHELL = ("PYTHONPATH", "VIRTUAL_ENV", "RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE",
                     "MASTER_ADDR", "MASTER_PORT", "GROUP_RANK", "TORCHELASTIC_RUN_ID", "PYTEST_CURRENT_TEST")
"""What the test process may carry that a user's shell does not (shardtop's own variables go too)."""
GLOO_TEARDOWN_ABORT = "terminate called without an active exception"
"""Raw gloo runs abort at interpreter exit now and then, with or without shardtop (DESIGN.md)."""
REHEARSED = "devices=8"
REHEARSED_RANKS = "rank=0,last"


@dataclass(frozen=True)
class Ended:
    """How a command ended: its exit code and everything it printed."""

    code: int
    output: str


@dataclass(frozen=True)
class Workspace:
    """Where a framework's commands run: its environment, a working directory, and shardtop's runs."""

    env: Environment
    workdir: Path
    extra_env: tuple[tuple[str, str], ...] = ()

    def environ(self, runs_dir: Path) -> dict[str, str]:
        kept = {k: v for k, v in os.environ.items() if k not in NOT_A_USERS_SHELL and not k.startswith("SHARDTOP_")}
        path = os.pathsep.join([str(self.env.bin), kept.get("PATH", "")])
        # DeepSpeed builds its CPU ops at first use into torch's extensions folder, under one name whatever its
        # version: each environment keeps its own, or two DeepSpeed versions rebuild and load each other's
        extensions = str(self.env.root / "torch_extensions")
        return {**kept, **OFFLINE_CPU, **dict(self.extra_env), "PATH": path, "VIRTUAL_ENV": str(self.env.root),
                "TORCH_EXTENSIONS_DIR": extensions, "SHARDTOP_RUNS_DIR": str(runs_dir)}

    def run(self, command: list[str], runs_dir: Path, timeout: float = RUN_TIMEOUT) -> Ended:
        runs_dir.mkdir(parents=True, exist_ok=True)
        code, stdout, stderr = bounded(command, self.workdir, self.environ(runs_dir), timeout)
        return Ended(code, stdout + stderr)


@dataclass(frozen=True)
class ShardtopRun:
    """A command run by ``shardtop run`` or ``shardtop rehearse``: how shardtop ended, and the run it made."""

    ended: Ended
    run_dir: Path
    report: dict[str, Any]
    report_error: str

    def command_log(self) -> str:
        logs = sorted((self.run_dir / "logs").glob("command-*.log"))
        return "\n".join(p.read_text(errors="replace") for p in logs)

    def describe(self) -> str:
        return (f"exit {self.ended.code}; run directory {self.run_dir}\n--- shardtop ---\n{self.ended.output[-3000:]}"
                f"\n--- the command's log ---\n{self.command_log()[-6000:]}\n--- report ---\n{self.report_error}")


@dataclass(frozen=True)
class Plan:
    """``shardtop plan devices=8 --format json -- CMD``: how it ended, the plan, and what it said on stderr."""

    ended: Ended
    plan: dict[str, Any] | None
    stderr: str

    def as_run(self) -> dict[str, Any]:
        assert self.plan is not None, self.describe()
        option: dict[str, Any] = self.plan["options"][0]
        return option

    def describe(self) -> str:
        return f"exit {self.ended.code}\n--- stderr ---\n{self.stderr[-5000:]}"


def alone(space: Workspace, command: list[str], tag: str) -> Ended:
    return space.run(command, space.workdir / f"runs-{tag}")


def under_run(space: Workspace, command: list[str], tag: str) -> ShardtopRun:
    """``shardtop run --headless --run-dir DIR -- COMMAND``."""
    runs = space.workdir / f"runs-{tag}"
    run_dir = runs / "run"
    ended = space.run(["shardtop", "run", "--headless", "--run-dir", str(run_dir), "--", *command], runs)
    return _with_report(space, ended, run_dir, runs)


def rehearsed(space: Workspace, command: list[str], tag: str) -> ShardtopRun:
    """``shardtop rehearse devices=8 rank=0,last --headless -- COMMAND``, as a user types it."""
    runs = space.workdir / f"runs-{tag}"
    ended = space.run(["shardtop", "rehearse", REHEARSED, REHEARSED_RANKS, "--headless", "--", *command], runs)
    made = sorted(p for p in runs.iterdir() if p.is_dir()) if runs.is_dir() else []
    assert len(made) == 1, f"expected one run under {runs}, found {made}:\n{ended.output[-3000:]}"
    return _with_report(space, ended, made[0], runs)


def planned(space: Workspace, command: list[str], tag: str) -> Plan:
    """``shardtop plan devices=8 --format json -- COMMAND``: the JSON on stdout, the script's output on stderr."""
    runs = space.workdir / f"runs-{tag}"
    runs.mkdir(parents=True, exist_ok=True)
    code, stdout, stderr = bounded(["shardtop", "plan", REHEARSED, "--format", "json", "--", *command],
                                   space.workdir, space.environ(runs), RUN_TIMEOUT)
    try:
        plan = json.loads(stdout) if stdout.strip() else None
    except ValueError:
        plan = None
    return Plan(Ended(code, stdout + stderr), plan, stderr)


class TimedOut(AssertionError):
    """A command ran past its time: the command, and the last of what it printed."""


def bounded(command: list[str], cwd: Path, env: dict[str, str], timeout: float) -> tuple[int, str, str]:
    """Run a command to its end: its exit code, stdout and stderr.

    Past ``timeout`` every process it started is killed (torchrun's ranks too, which a kill of torchrun
    alone would leave behind) and ``TimedOut`` says what it printed last: a rank that hangs after training
    (gloo's teardown) shows its last lines rather than a bare timeout.
    """
    with subprocess.Popen(command, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          text=True) as process:
        try:
            stdout, stderr = process.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            _kill_tree(process.pid)
            stdout, stderr = process.communicate()
            raise TimedOut(f"`{' '.join(command)}` ran past {timeout:.0f} s and was killed; it printed last:\n"
                           f"--- stdout ---\n{stdout[-3000:]}\n--- stderr ---\n{stderr[-3000:]}") from None
    return process.returncode, stdout, stderr


def _kill_tree(pid: int) -> None:
    try:
        root = psutil.Process(pid)
        tree = [*root.children(recursive=True), root]
    except psutil.NoSuchProcess:
        return
    for process in tree:
        with contextlib.suppress(psutil.NoSuchProcess):
            process.kill()
    psutil.wait_procs(tree, timeout=30)


def _with_report(space: Workspace, ended: Ended, run_dir: Path, runs: Path) -> ShardtopRun:
    done = subprocess.run(["shardtop", "report", str(run_dir), "--format", "json"], cwd=space.workdir,
                          env=space.environ(runs), capture_output=True, text=True, timeout=120, check=False)
    report: dict[str, Any] = {}
    if done.returncode == 0:
        report = json.loads(done.stdout)
    return ShardtopRun(ended, run_dir, report, "" if done.returncode == 0 else done.stdout + done.stderr)


@dataclass(frozen=True)
class Finish:
    """Where training ended, as the framework prints it: the last step and its loss, as printed."""

    steps: int
    loss: str


def torn_down_by_gloo(ended: Ended, log: str) -> bool:
    """The command finished its work and then died in gloo's teardown (DESIGN.md), not of anything it did."""
    return ended.code != 0 and GLOO_TEARDOWN_ABORT in ended.output + log


def assert_ended_alike(alone: Ended, probed: ShardtopRun, finish: Callable[[str], Finish | None]) -> None:
    """The command under ``shardtop run`` ended as it did alone: the same exit code, step and loss.

    An exit code that differs only because gloo aborted at interpreter exit, after training ended,
    is not the command ending differently (it happens with or without shardtop).
    """
    trained = finish(alone.output)
    assert trained is not None, f"the command alone did not train (exit {alone.code}):\n{alone.output[-6000:]}"
    log = probed.command_log()
    if probed.ended.code != alone.code:
        teardown = torn_down_by_gloo(alone, "") or torn_down_by_gloo(probed.ended, log)
        assert teardown and finish(log) is not None, (
            f"alone the command exited {alone.code}, under shardtop run {probed.ended.code}:\n{probed.describe()}")
    assert finish(log) == trained, (
        f"alone the command ended at {trained}, under shardtop run at {finish(log)}:\n{probed.describe()}")
