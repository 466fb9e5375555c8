"""``gpu_mem_limit`` in a user's command on CPU: the allocator cap armed once torch has loaded.

``shardtop run --gpu-mem-limit`` (and fit's rehearsals) preload the allocator cap of a preset's CPU ranks
(``runner/cpu_cap.c``) into the command (``own_job/mem_cap.py``).  Nothing is capped until it is armed:
here, in every Python process of the command, the moment ``torch`` has finished loading, so the
interpreter and torch itself are not counted and what the script allocates from then on is (a preset's
rank arms it after its imports the same way).  On a GPU the cap is the CUDA allocator's own
(``PYTORCH_CUDA_ALLOC_CONF``) and nothing is armed here.
"""

from __future__ import annotations

import os

TYPE_CHECKING = False
if TYPE_CHECKING:
    from types import ModuleType

    from shardtop.inject.import_hook import Patch

MEM_LIMIT_ENV = "SHARDTOP_MEM_LIMIT"
"""``runner.limits.MEM_LIMIT_ENV``: the cap in bytes (not imported from there: a launcher pays for every import)."""
LIBRARY_ENV = "SHARDTOP_CPU_CAP_LIBRARY"
"""``probe.allocator_cap.LIBRARY_ENV``: set where the cap's library is preloaded."""


def arm_after_torch(module: ModuleType) -> None:
    """Arm the preloaded cap at ``SHARDTOP_MEM_LIMIT`` bytes from now on, once per process."""
    limit = os.environ.get(MEM_LIMIT_ENV, "")
    if not limit.isdigit():
        return
    from shardtop.probe.allocator_cap import allocator_cap

    cap = allocator_cap()
    if cap is not None and not cap.armed:
        cap.arm(int(limit))


def patches() -> dict[str, Patch]:
    """``{"torch": arm_after_torch}`` where a cap is asked for and its library preloaded; else nothing."""
    if os.environ.get(LIBRARY_ENV) and os.environ.get(MEM_LIMIT_ENV, "").isdigit():
        return {"torch": arm_after_torch}
    return {}
