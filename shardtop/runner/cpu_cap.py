"""``gpu_mem_limit`` on CPU: a cap on what the rank's C allocator hands out, refused at the allocation.

A GPU's allocator refuses a request past ``set_per_process_memory_fraction``
and torch raises its out-of-memory error inside the module that asked.  A CPU
rank has no such allocator, so a preset's CPU ranks get a small library
preloaded (``cpu_cap.c``, built with the machine's C compiler into the user's
cache the first time) that counts what ``malloc`` and its kin hand out and
refuses what would take the rank past its cap, once the rank arms it after
its imports.  torch then raises ``DefaultCPUAllocator: can't allocate memory``
at the very allocation, as on a GPU.  Thread stacks, shared memory and
untouched address space are not allocations and do not count, unlike a data
segment limit (``RLIMIT_DATA``), which is what applies where no C compiler is
found.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
from importlib import resources
from pathlib import Path

from shardtop.probe.allocator_cap import LIBRARY_ENV, allocator_cap

COMPILERS = ("cc", "gcc", "clang")


def cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "shardtop"


def library() -> tuple[Path | None, str]:
    """The built library (building it the first time), or None and why not."""
    source = resources.files("shardtop.runner").joinpath("cpu_cap.c").read_bytes()
    digest = hashlib.sha256(source).hexdigest()[:16]
    built = cache_dir() / f"cpu-cap-{digest}.so"
    if built.exists():
        return built, ""
    compiler = next((c for c in COMPILERS if shutil.which(c)), None)
    if compiler is None:
        return None, "no C compiler (cc, gcc or clang) on PATH"
    built.parent.mkdir(parents=True, exist_ok=True)
    work = built.with_suffix(f".{os.getpid()}.tmp")
    src = work.with_suffix(".c")
    src.write_bytes(source)
    done = subprocess.run([compiler, "-shared", "-fPIC", "-O2", "-o", str(work), str(src), "-ldl"],
                          capture_output=True, text=True, check=False)
    src.unlink(missing_ok=True)
    if done.returncode != 0:
        work.unlink(missing_ok=True)
        return None, f"{compiler} could not build it: {(done.stderr or done.stdout).strip()[-300:]}"
    os.replace(work, built)  # whole or not at all: ranks building at once each rename their own
    return built, ""


def preload(env: dict[str, str]) -> str:
    """Preload the library into a rank's environment; "" if done, else why the cap falls back."""
    if not sys.platform.startswith("linux"):
        return "the allocator cap is built for Linux only"
    path, why = library()
    if path is None:
        return why
    env["LD_PRELOAD"] = ":".join(p for p in (str(path), env.get("LD_PRELOAD", "")) if p)
    env[LIBRARY_ENV] = str(path)
    return ""


def arm(limit: int) -> bool:
    """Cap what this process's allocator hands out from now on at ``limit`` bytes; False where the library
    is not loaded here."""
    cap = allocator_cap()
    if cap is None:
        return False
    cap.arm(limit)
    return True
