"""A memory cgroup for the ranks of a test run: a real limit on the host memory they may use,
as a container, SLURM or Kubernetes gives a job.

Needs permission to create cgroups (root, with the memory controller mounted, v1 or v2);
``memory_cgroup`` returns None where that is not so, and the test skips with the reason.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

ROOT = Path("/sys/fs/cgroup")


def _own_memory_cgroup() -> tuple[Path, str] | None:
    """(this process's memory cgroup folder, the limit file's name), v1 or v2."""
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if "memory" in controllers.split(","):
            return ROOT / "memory" / path.lstrip("/"), "memory.limit_in_bytes"
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if controllers == "" and (ROOT / "cgroup.controllers").exists():
            return ROOT / path.lstrip("/"), "memory.max"
    return None


def memory_cgroup(name: str, limit: int) -> tuple[Path | None, str]:
    """A new child of this process's memory cgroup limited to ``limit`` bytes, or (None, why not)."""
    found = _own_memory_cgroup()
    if found is None:
        return None, "no memory cgroup controller is mounted"
    parent, limit_file = found
    child = parent / f"{name}-{os.getpid()}"
    try:
        child.mkdir(exist_ok=True)
        (child / limit_file).write_text(str(limit))
    except OSError as e:
        return None, f"cannot make a memory cgroup under {parent}: {e}"
    return child, ""


def entering(cgroup: Path) -> Callable[[], None]:
    """A ``preexec_fn`` that moves the new process into ``cgroup`` before it runs anything."""
    procs = str(cgroup / "cgroup.procs")

    def enter() -> None:
        with open(procs, "w") as f:
            f.write(str(os.getpid()))

    return enter


def remove(cgroup: Path) -> None:
    """Remove the cgroup once its processes are gone (left in place if one still runs)."""
    try:
        cgroup.rmdir()
    except OSError:
        pass
