"""``gpu_mem_limit`` for a user's command: each rank capped from outside the script.

On a GPU, PyTorch's caching allocator reads its cap from the environment
(``PYTORCH_CUDA_ALLOC_CONF=per_process_memory_fraction:F``), as a 141 GB H200 then behaves like a 16 GB
card; the fraction is of the first GPU the command sees.  torch takes that setting from 2.10 on
(``FRACTION_FROM``); an older one refuses a setting it does not know, so with it the ranks run uncapped
and the supervisor's log says so.  On CPU, the ranks get the
allocator cap of a preset's CPU ranks (``runner/cpu_cap.py``) preloaded, and the bootstrap arms it once
torch has loaded (``inject/mem_cap.py``): what a rank's C allocator hands out from then on is capped, and
torch raises its out-of-memory error at the allocation past the cap.  Either way the probe reads the cap
from ``SHARDTOP_MEM_LIMIT`` and says it beside every sample.
"""

from __future__ import annotations

from collections.abc import Callable

from shardtop.runner.limits import CAP_FALLBACK_ENV, MEM_LIMIT_ENV

ALLOC_CONF = "PYTORCH_CUDA_ALLOC_CONF"
FRACTION_FROM = (2, 10)
"""The first torch whose allocator takes ``per_process_memory_fraction`` from ``PYTORCH_CUDA_ALLOC_CONF``."""


def torch_version() -> tuple[int, int] | None:
    """The installed torch's major and minor version, read from its metadata (torch is not imported)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        major, minor, *_ = version("torch").split(".")
        return int(major), int(minor)
    except (PackageNotFoundError, ValueError):
        return None


def first_gpu_total() -> int | None:
    """The memory of the first GPU NVML sees; None without one."""
    from shardtop.gpus import nvml_or_none

    nvml = nvml_or_none()
    if nvml is None or nvml.count == 0:
        return None
    return nvml.sample(with_processes=False)[0].total


def cap_environment(
    env: dict[str, str], limit: int, *, on_gpu: bool, gpu_total: Callable[[], int | None] = first_gpu_total,
    torch: Callable[[], tuple[int, int] | None] = torch_version,
) -> str:
    """Cap the command's ranks at ``limit`` bytes through ``env``; "" when done, else why it is not."""
    env[MEM_LIMIT_ENV] = str(limit)
    if on_gpu:
        found = torch()
        if found is None or found < FRACTION_FROM:
            shown = f"torch {found[0]}.{found[1]}" if found else "no torch found here"
            return (f"{shown}: the CUDA allocator takes its cap from the environment from torch 2.10 on; the "
                    "command runs without the cap (torch.cuda.set_per_process_memory_fraction in the script sets it)")
        total = gpu_total()
        if total is None:
            return "no GPU's memory could be read (NVML): the command runs without the cap"
        if limit >= total:
            return ""
        asked = env.get(ALLOC_CONF, "")
        kept = [p for p in asked.split(",") if p and not p.strip().startswith("per_process_memory_fraction")]
        env[ALLOC_CONF] = ",".join([*kept, f"per_process_memory_fraction:{limit / total:.6f}"])
        return ""
    from shardtop.runner.cpu_cap import preload

    env[CAP_FALLBACK_ENV] = preload(env)
    return env[CAP_FALLBACK_ENV]
