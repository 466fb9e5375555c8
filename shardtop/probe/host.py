"""The host's memory as a rank sees it: physical RAM, the limit of the rank's cgroup, and how
CUDA's caching allocator was configured.

A job in a container, or under SLURM or Kubernetes, may use only what its
cgroup allows, which is often far less than the machine has: that limit,
where lower than the RAM, is what "every rank loads the whole model into host
memory" must be weighed against.  Read once, when the rank says hello; never
raises.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import psutil

UNLIMITED = 1 << 62
"""cgroup v1 writes "no limit" as a number near 2**63."""

ALLOC_CONF_VARS = ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF")


@dataclass(frozen=True)
class HostFacts:
    memory: int | None
    memory_limit: int | None
    """The cgroup's limit, only where lower than ``memory``."""
    alloc_conf: str | None


def host_facts() -> HostFacts:
    try:
        memory: int | None = int(psutil.virtual_memory().total)
    except Exception:  # noqa: BLE001 - a probe never fails a rank
        memory = None
    try:
        limit = cgroup_memory_limit()
    except Exception:  # noqa: BLE001
        limit = None
    if limit is not None and memory is not None and limit >= memory:
        limit = None
    conf = next((os.environ[v] for v in ALLOC_CONF_VARS if os.environ.get(v)), None)
    return HostFacts(memory, limit, conf)


def cgroup_memory_limit(proc: str = "/proc/self/cgroup", root: str = "/sys/fs/cgroup") -> int | None:
    """The lowest memory limit on the way from this process's cgroup up to the top (v1 or v2)."""
    limits: list[int] = []
    for line in Path(proc).read_text().splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _, controllers, path = parts
        if controllers == "":
            base, name = Path(root), "memory.max"
        elif "memory" in controllers.split(","):
            base, name = Path(root) / "memory", "memory.limit_in_bytes"
        else:
            continue
        for folder in _ancestors(base, path):
            value = _read_limit(folder / name)
            if value is not None:
                limits.append(value)
    return min(limits) if limits else None


def _ancestors(base: Path, path: str) -> list[Path]:
    """``base/a/b``, ``base/a``, ``base``: those that exist (in a cgroup namespace only ``base``)."""
    parts = [p for p in path.strip("/").split("/") if p]
    folders = [base.joinpath(*parts[:i]) for i in range(len(parts), -1, -1)]
    return [f for f in folders if f.is_dir()]


def _read_limit(path: Path) -> int | None:
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    if not text.isdigit():
        return None  # "max": no limit
    value = int(text)
    return value if 0 < value < UNLIMITED else None
