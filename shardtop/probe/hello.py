"""The hello a rank writes first: who it is, where it runs, and with which versions of what."""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping

from shardtop.probe.host import host_facts
from shardtop.rundir.cluster import SlurmIds
from shardtop.rundir.engines import DEEPSPEED, FSDP1, FSDP2
from shardtop.rundir.events import Hello


def hello_event(world_size: int, local_rank: int, node_rank: int, device: str, *, engine: str = "",
                strategy: str = "", program: str = "") -> Hello:
    """This process's ``Hello``: its pid, its place in the job, the host's memory and cap, Slurm's ids."""
    slurm = SlurmIds.from_env()
    host = host_facts()
    return Hello(
        pid=os.getpid(),
        world_size=world_size,
        local_rank=local_rank,
        node_rank=node_rank,
        device=device,
        engine=engine,
        strategy=strategy,
        program=program,
        versions=versions(),
        slurm_job_id=slurm.job_id,
        slurm_step_id=slurm.step_id,
        slurm_node=slurm.node,
        host_memory=host.memory,
        host_memory_limit=host.memory_limit,
        alloc_conf=host.alloc_conf,
        asked_engine=engine_asked(os.environ),
    )


def engine_asked(env: Mapping[str, str]) -> str:
    """The engine accelerate's launcher (or the Trainer's ``--fsdp`` / ``--deepspeed``) asked for."""
    if env.get("ACCELERATE_USE_DEEPSPEED", "").lower() == "true":
        stage = env.get("ACCELERATE_DEEPSPEED_ZERO_STAGE", "")
        return f"zero{stage}" if stage in ("1", "2", "3") else DEEPSPEED
    if env.get("ACCELERATE_USE_FSDP", "").lower() == "true":
        return FSDP2 if env.get("FSDP_VERSION") == "2" else FSDP1
    return ""


def versions() -> dict[str, str]:
    out = {"python": sys.version.split()[0]}
    for name in ("torch", "lightning", "deepspeed"):
        mod = sys.modules.get(name)
        if mod is not None and hasattr(mod, "__version__"):
            out[name] = str(mod.__version__)
    return out
