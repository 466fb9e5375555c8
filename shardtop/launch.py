"""Start a run in its own session and stop it (``shardtop.headless`` follows it).

The run's supervisor is started through a short-lived intermediate that forks
it into a session of its own and exits at once (a double fork).  The
supervisor is then nobody's child here: it survives the terminal (or SSH
connection) that launched it, and neither the CLI nor the TUI ever has a
process to reap.  It leads its own process group; stopping a run signals
exactly that group.  The supervisor writes ``exit.json``; readers only read it.
"""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from shardtop.config import ConfigError, on_machine
from shardtop.rundir.cluster import host_name
from shardtop.rundir.engines import ZERO_ENGINES
from shardtop.rundir.liveness import is_running, process_start_time
from shardtop.rundir.run_config import RunConfig
from shardtop.rundir.run_directory import RunDirectory, RunError
from shardtop.rundir.run_meta import RunMeta
from shardtop.units import format_bytes

CPU_RANKS_PER_CORE = 4
"""CPU ranks a core may carry: gloo ranks mostly wait on each other, more only thrash."""
CPU_RANK_MEMORY = 3 * 2**29
"""Memory set aside per CPU rank (1.5 GiB): a DeepSpeed ZeRO-3 rank of ``zero3-linear``
on CPU was measured at about 1.3 GiB resident, torch and the engine included."""


@dataclass(frozen=True)
class CpuRoom:
    """What this machine offers CPU ranks: the cores this process may use, and its memory."""

    cores: int
    memory: int
    """Bytes: physical memory, or the cgroup's limit when that is lower."""

    @property
    def ranks(self) -> int:
        return max(1, min(CPU_RANKS_PER_CORE * self.cores, self.memory // CPU_RANK_MEMORY))

    def describe(self) -> str:
        return (
            f"this machine has {self.cores} CPU core(s) and {format_bytes(self.memory)} of memory, "
            f"room for at most {self.ranks} CPU process(es) ({CPU_RANKS_PER_CORE} per core, "
            f"{format_bytes(CPU_RANK_MEMORY)} each)"
        )


def cpu_room() -> CpuRoom:
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        cores = os.cpu_count() or 1
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    try:  # a container's memory limit (cgroup v2), when it is lower
        limit = Path("/sys/fs/cgroup/memory.max").read_text().strip()
        if limit.isdigit():
            memory = min(memory, int(limit))
    except OSError:
        pass
    return CpuRoom(cores=max(1, cores), memory=memory)


def missing_engines(engine: str) -> list[str]:
    """The training libraries a preset of ``engine`` needs that this Python lacks (imports none of them)."""
    import importlib.util

    def missing(name: str) -> bool:
        try:
            return importlib.util.find_spec(name) is None
        except (ImportError, ValueError):
            return True

    needed = ["torch", "lightning"] + (["deepspeed"] if engine in ZERO_ENGINES else [])
    return [name for name in needed if missing(name)]


class TooManyDevices(ConfigError):
    """``devices=N`` asks for more GPUs (or CPU processes) than this machine has.

    A rehearsal runs such a job here, one rank at a time (``shardtop rehearse``): ``offer`` adds the
    command for the user's own settings.  Not for a preset that drives every device from one
    process (manual placement): it has no rank to rehearse.
    """

    def __init__(self, reason: str, devices: int, accelerator: str, rehearsable: bool) -> None:
        super().__init__(reason)
        self.reason = reason
        self.devices = devices
        self.accelerator = accelerator
        self.rehearsable = rehearsable

    @property
    def rehearsal_words(self) -> str:
        """What a rehearsal would do instead, in a user's words."""
        if self.accelerator == "cuda":
            return f"rehearse the {self.devices}-GPU job on this machine's first GPU, one rank at a time"
        return f"rehearse the {self.devices}-rank job as one CPU process at a time"

    def offer(self, settings: Sequence[str]) -> str:
        """The reason, then the rehearsal to type for ``settings`` (``shardtop launch``'s words)."""
        if not self.rehearsable:
            return self.reason
        return f"{self.reason}\nOr {self.rehearsal_words}: {rehearsal_command(settings)}"


def rehearsal_settings(settings: Sequence[str]) -> list[str]:
    """``shardtop launch``'s settings as ``shardtop rehearse`` takes them: the preset's name first, the
    rest as typed, ``devices=N`` included."""
    preset = ""
    rest: list[str] = []
    for i, arg in enumerate(settings):
        key, eq, value = arg.partition("=")
        if eq and key.strip() == "preset":
            preset = value.strip()
        elif not eq and i == 0:
            preset = arg
        else:
            rest.append(arg)
    return [preset, *rest] if preset else rest


def rehearsal_command(settings: Sequence[str]) -> str:
    """``shardtop rehearse PRESET devices=N …``: the rehearsal of the launch ``settings`` ask for."""
    return shlex.join(["shardtop", "rehearse", *rehearsal_settings(settings)])


def resolve_devices(
    config: Mapping[str, Any], gpu_count: Callable[[], int], cpu: Callable[[], CpuRoom] = cpu_room
) -> dict[str, object]:
    """Fix ``accelerator`` to cpu/cuda and ``world_size`` to a number as this machine runs the preset
    (``config.on_machine``, which ``shardtop plan`` shares), or say why it cannot run here."""
    missing = missing_engines(str(config.get("engine", "")))
    if missing:
        raise ConfigError(
            f"the presets train with {', '.join(missing)}, which this Python ({sys.executable}) does not have.\n"
            "Install them with: pip install 'shardtop[engines]' (keep the CUDA torch you have on a GPU box). "
            "Your own scripts need no preset: shardtop run -- python train.py"
        )
    gpus = gpu_count()
    if config.get("accelerator") == "cuda" and gpus == 0:
        raise ConfigError(
            "accelerator=cuda, but no NVIDIA GPU is visible (no driver, or CUDA_VISIBLE_DEVICES hides them).\n"
            "Use accelerator=cpu (or auto) to run on CPU processes."
        )
    config, accelerator, devices = on_machine(config, gpus)
    if accelerator == "cuda":
        if devices > gpus:
            raise TooManyDevices(
                f"devices={devices}, but this machine has {gpus} GPU(s). Use devices={gpus} or fewer.",
                devices, "cuda", rehearsable=not config.get("single_process"),
            )
    else:
        room = cpu()
        if devices > room.ranks and not config.get("single_process"):
            raise TooManyDevices(
                f"devices={devices} on CPU: {room.describe()}. Use devices={room.ranks} or fewer.",
                devices, "cpu", rehearsable=True,
            )
    return config


def create_run(root: Path, config: RunConfig, command: Sequence[str]) -> RunDirectory:
    """A new run of a resolved preset under ``root``: its directory, and its ``run.json`` saying ``config``
    and the ``command`` that asked for it (``start`` starts it)."""
    meta = RunMeta(preset=config.preset, command=tuple(command), config=config)
    return RunDirectory.create(root, config.preset, meta)


@dataclass(frozen=True)
class Supervisor:
    """The run's supervisor as recorded in ``run.json``."""

    pid: int
    pgid: int
    started: float | None
    """Its start time, so a later reader can tell it from a process that reused the pid."""


def start(run: RunDirectory) -> Supervisor:
    """Start the run's supervisor, detached from this process and its terminal; record it.

    ``python -m shardtop.runner --detach`` forks the supervisor into a new
    session, the supervisor prints its pid, and the intermediate exits at once:
    it is reaped here, and the supervisor is re-parented away from us.  The
    supervisor starts no rank until this function has written its pid,
    process group and start time to ``run.json`` and closed its stdin, so no
    reader ever sees ranks of a run without a recorded supervisor.  Takes
    about 0.1 s (one interpreter start-up).
    """
    try:
        log = os.open(run.runner_log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    except OSError as e:
        raise RunError(f"cannot write to the run directory {run.path}: {e.strerror}") from None
    try:
        intermediate = subprocess.Popen(
            [sys.executable, "-m", "shardtop.runner", "--detach", str(run.path)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=log,
            start_new_session=True,
            close_fds=True,
            umask=0o077,
        )
    finally:
        os.close(log)
    assert intermediate.stdin is not None and intermediate.stdout is not None
    with intermediate.stdin, intermediate.stdout:
        line = intermediate.stdout.readline()
        code = intermediate.wait()
        if not line.strip().isdigit():
            run.write_exit(1, reason="the supervisor did not start", ending="failed")
            raise RunError(
                f"the run's supervisor did not start (exit {code}); its output is in {run.runner_log}"
            )
        pid = int(line)
        try:
            pgid = os.getpgid(pid)
        except ProcessLookupError:
            pgid = pid  # it already ended; its own exit record says how
        supervisor = Supervisor(pid=pid, pgid=pgid, started=process_start_time(pid))
        try:
            run.update_meta(pid=supervisor.pid, pgid=supervisor.pgid, pid_started=supervisor.started)
        except OSError as e:
            _kill(pid, signal.SIGKILL)  # it is still waiting for our word: nothing has started
            raise RunError(f"cannot record the run in {run.meta_path}: {e.strerror}") from None
    # leaving the block closed the supervisor's stdin: its signal to start the ranks
    return supervisor


def stop(run: RunDirectory, grace: float = 10.0, out: Callable[[str], None] = print) -> bool:
    """SIGTERM to the run's process group, SIGKILL after ``grace``; touches nothing else.

    Returns False if the run was not running.
    """
    meta = run.read_meta()
    pids = [(pid, started) for pid, started in run.processes() if is_running(pid, started)]
    if not pids:
        return False
    asked_at = time.time()
    pgid = meta.pgid
    here = meta.host in ("", host_name())  # another host's pid numbers mean nothing here
    leader_alive = here and meta.pid is not None and is_running(meta.pid, meta.pid_started)
    if pgid and leader_alive:
        _killpg(pgid, signal.SIGTERM)
    else:
        for pid, _ in pids:
            _kill(pid, signal.SIGTERM)
    out(f"sent SIGTERM to run {run.id}")
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline:
        if not any(is_running(pid, started) for pid, started in pids):
            break
        time.sleep(0.1)
    else:
        if pgid and leader_alive:
            _killpg(pgid, signal.SIGKILL)
        for pid, started in pids:
            if is_running(pid, started):
                _kill(pid, signal.SIGKILL)
        out(f"run {run.id} did not stop within {grace:.0f}s; sent SIGKILL")
        time.sleep(0.2)
    run.write_exit(
        128 + signal.SIGTERM, signal=signal.SIGTERM, reason="stopped", stop_requested=asked_at, ending="stopped"
    )
    return True


def _killpg(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        pass
    except PermissionError:
        raise RunError(f"not allowed to signal process group {pgid}: the run is someone else's.") from None


def _kill(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass
    except PermissionError:
        raise RunError(f"not allowed to signal process {pid}: it is someone else's.") from None


