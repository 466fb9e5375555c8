"""Where a process runs: its host, and the SLURM job and step it belongs to.

A job over several hosts is one run when its run directory is on storage the
hosts share; what tells the hosts apart is the host name on every event, and
on a SLURM cluster the job and step ids the scheduler sets.  No torch here.
"""

from __future__ import annotations

import os

import msgspec

HEARTBEAT_S = 5.0
"""How often a supervisor of ``shardtop run`` touches its record while its command runs."""
STALE_AFTER_S = 60.0
"""A process on another host counts as gone once its files have not changed for this long
(ranks write a memory sample every half second; supervisors touch their record every 5 s)."""


def host_name() -> str:
    """This machine's name, as ``socket.gethostname()`` gives it (without importing ``socket``)."""
    return os.uname().nodename


class SlurmIds(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """The SLURM job, step and node of this process ("" outside SLURM); ``run.json`` holds only what is known."""

    job_id: str = ""
    step_id: str = ""
    node: str = ""

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None) -> SlurmIds:
        env = dict(os.environ) if env is None else env
        return cls(
            job_id=env.get("SLURM_JOB_ID", "") or env.get("SLURM_JOBID", ""),
            step_id=env.get("SLURM_STEP_ID", "") or env.get("SLURM_STEPID", ""),
            node=env.get("SLURMD_NODENAME", ""),
        )

    def __bool__(self) -> bool:
        return bool(self.job_id)
