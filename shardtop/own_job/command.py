"""``shardtop run``: make (or join) the run, start the command's supervisor detached, follow it.

The supervisor runs in a session of its own (``start_new_session``): closing
the terminal or losing the SSH connection stops neither it nor the command,
and ``shardtop attach`` finds the run again.  With ``--run-dir`` (or
``$SHARDTOP_RUN_DIR``) naming a new or empty directory, the first ``shardtop
run`` to get there makes the run and every other one, on this host or another
sharing the directory, joins it.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from shardtop.headless import HeadlessFollower
from shardtop.own_job.supervisor import command_log
from shardtop.rundir.cluster import host_name
from shardtop.rundir.liveness import process_start_time
from shardtop.rundir.run_config import RehearsalConfig, RunConfig
from shardtop.rundir.run_directory import RUN_DIR_ENV, RunDirectory, RunError, ensure_root, runs_root
from shardtop.rundir.run_meta import RunMeta

RUN_ENTRIES = re.compile(
    r"^(run\.json|exit\.json|events|logs|supervisors|bootstrap|runner\.log|\.rank-\d+\.pid\.json|\..*\.(tmp|new))$"
)
"""What a run directory may hold before this host joins it (another host or rank may be making it now)."""


@dataclass(frozen=True)
class StartedCommand:
    run: RunDirectory
    supervisor: subprocess.Popen[bytes]
    created: bool
    """This call made the run (else it joined one another host or process made)."""


def job_name(command: list[str]) -> str:
    """What the run is called: the script (``train`` for ``torchrun … train.py``), else the program."""
    name = ""
    for i, arg in enumerate(command):
        if arg.endswith(".py"):
            name = Path(arg).stem
            break
        if arg == "-m" and i + 1 < len(command):
            name = command[i + 1].rsplit(".", 1)[-1]
            break
    name = name or Path(command[0]).name
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", name).strip("-.") or "job"


def _check_command(command: list[str]) -> list[str]:
    if command[:1] == ["--"]:
        command = command[1:]
    if not command:
        raise RunError(
            "shardtop run needs the command to run after --, for example:\n"
            "  shardtop run -- python train.py\n"
            "  shardtop run -- torchrun --nproc_per_node 8 train.py"
        )
    program = command[0]
    if shutil.which(program) is None:
        where = "is not a file" if os.sep in program else "is not on PATH"
        raise RunError(f"cannot run {program!r}: it {where}. Check the command after --, or give its full path.")
    return command


def _check_run_dir(path: Path) -> None:
    """A new or empty directory, or one holding a run that is still going (to join it)."""
    if path.exists() and not path.is_dir():
        raise RunError(f"{path} is a file; --run-dir names a directory (new or empty) for the run.")
    if not path.is_dir():
        return
    strange = sorted(p.name for p in path.iterdir() if not RUN_ENTRIES.match(p.name))
    if strange and not (path / "run.json").exists():
        shown = ", ".join(strange[:5]) + (" …" if len(strange) > 5 else "")
        raise RunError(
            f"{path} is not empty ({shown}) and holds no shardtop run.\n"
            "Name a new or empty directory with --run-dir, or leave it out for a new run under the runs directory."
        )
    run = RunDirectory(path)
    if (path / "run.json").exists() and run.read_exit() is not None:
        raise RunError(
            f"{path} holds a run that has already ended ({run.status().describe()}).\n"
            "Name a new directory with --run-dir, or leave it out for a new run under the runs directory."
        )


def start_command(
    command: list[str],
    *,
    runs_dir: str | None = None,
    run_dir: str | None = None,
    name: str | None = None,
    rehearsal: RehearsalConfig | None = None,
    mem_limit: int | None = None,
) -> StartedCommand:
    """Check the command line, make or join the run, start the supervisor; nothing is made on bad input.

    ``rehearsal`` (``shardtop rehearse``): the run rehearses these ranks of a larger job, the command
    once per rank, one after another.  ``mem_limit``: each rank capped at that many bytes
    (``gpu_mem_limit``, ``own_job/mem_cap.py``).
    """
    command = _check_command(command)
    if runs_dir and run_dir:
        raise RunError("give either --runs-dir (a new run under it) or --run-dir (this run's own directory), not both.")
    run_dir = run_dir or (None if runs_dir else os.environ.get(RUN_DIR_ENV)) or None  # --runs-dir: a new run
    name = name or job_name(command)
    config = RunConfig(program=name, world_size=rehearsal.world_size if rehearsal is not None else 0,
                       gpu_mem_limit=mem_limit, rehearsal=rehearsal)
    # not a preset: the run is called after its program (config.program)
    meta = RunMeta(command=tuple(command), cwd=os.getcwd(), config=config, own_job=True)
    if run_dir:
        path = Path(run_dir).expanduser().absolute()
        _check_run_dir(path)
        run, created = RunDirectory.create_or_join(path, meta)
    else:
        run, created = RunDirectory.create(ensure_root(runs_root(runs_dir)), name, meta), True
    log = os.fdopen(os.open(command_log(run), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600), "ab", buffering=0)
    supervisor = subprocess.Popen(
        [sys.executable, "-m", "shardtop.own_job.supervisor", str(run.path), "--cwd", os.getcwd(), "--", *command],
        stdin=subprocess.DEVNULL,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
        close_fds=True,
    )
    log.close()
    if created:
        run.update_meta(pid=supervisor.pid, pgid=supervisor.pid, pid_started=process_start_time(supervisor.pid))
    return StartedCommand(run, supervisor, created)


def follow_command(job: StartedCommand, out: TextIO, every: int = 10) -> int:
    """Print the run's milestones until this host's command ends; return the command's exit code."""
    run = job.run
    follower = HeadlessFollower(run, out, every)
    what = "started a new run" if job.created else "joined the run"
    follower.say(f"{what} on {host_name()}; run directory {run.path}; output in {command_log(run)}")
    if not follower.follow(lambda _: job.supervisor.poll() is not None, goes_on="the command", ref=str(run.path)):
        return 130
    returncode = job.supervisor.returncode
    code = 128 - returncode if returncode < 0 else returncode
    if run.status().state == "running":  # another host's command is still going
        follower.poll()
        follower.say(f"command exited with {code} on {host_name()}; the run goes on on its other hosts")
    else:
        follower.finish()
        follower.say(f"command exited with {code} on {host_name()}")
    return code
