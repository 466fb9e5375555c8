"""What a starting rank is building: the compiler or build tool running under its process, and what for.

On a first launch a rank can spend half a minute before it says hello, its
log empty: DeepSpeed builds its CPU ops (torch extensions) with ninja and
c++, as the rank's children.  The run directory says only that the rank is
starting; the processes say what it does.  Only a rank on this host can be
looked at, and only its children are read: their names, command lines and
start times.  A compiler's command line names the torch extension it builds
(``-DTORCH_EXTENSION_NAME=deepspeed_shm_comm``); where none does, only the
program is said.

``build_words`` is pure; ``builds_under`` asks psutil, in the run feed's thread.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import PurePath

from shardtop.tui.format import duration

BUILD_PROGRAMS = frozenset(
    {"ninja", "make", "cmake", "c++", "g++", "gcc", "cc", "clang", "clang++", "cc1", "cc1plus", "nvcc", "cicc",
     "ptxas", "hipcc", "ld", "collect2"}
)  # fmt: skip
"""Programs that build code: a rank running one of them is building, not training."""
_EXTENSION = re.compile(r"(?:^|\s)-D\s*TORCH_EXTENSION_NAME=(\w+)")


@dataclass(frozen=True, slots=True)
class ChildProcess:
    """A process under a rank's: its program's name, its command line, when it started."""

    name: str
    command: tuple[str, ...]
    started: float


def extension_of(command: Sequence[str]) -> str | None:
    """The torch extension a compiler's command line builds, or None."""
    m = _EXTENSION.search(" ".join(command))
    return m.group(1) if m else None


def program_of(child: ChildProcess) -> str:
    """``c++`` for ``/usr/bin/c++ …`` (the command's first word, else the process's name)."""
    return PurePath(child.command[0]).name if child.command else child.name


def build_words(children: Sequence[ChildProcess], now: float) -> str:
    """``building the torch extension deepspeed_shm_comm (c++, 21s so far)``, ``running ninja (3s so far)``,
    or "" where no child builds anything."""
    builds = [c for c in children if program_of(c) in BUILD_PROGRAMS or c.name in BUILD_PROGRAMS]
    if not builds:
        return ""
    named = [c for c in builds if extension_of(c.command)]
    first = min(named or builds, key=lambda c: c.started)  # the compiler driver before the compiler proper
    program, since = program_of(first), duration(max(0.0, now - first.started))
    if named:
        return f"building the torch extension {extension_of(first.command)} ({program}, {since} so far)"
    return f"running {program} ({since} so far)"


def builds_under(pid: int, started: float | None) -> tuple[ChildProcess, ...]:
    """The processes under ``pid`` (children and theirs) while ``pid`` is still the process started at
    ``started``; none where it is gone or cannot be read."""
    import psutil

    from shardtop.rundir.liveness import is_running

    if not is_running(pid, started):
        return ()
    out = []
    try:
        children = psutil.Process(pid).children(recursive=True)
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return ()
    for child in children:
        try:
            out.append(ChildProcess(child.name(), tuple(child.cmdline()), child.create_time()))
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return tuple(out)
