"""Two hosts on one machine: each a UTS namespace with a host name of its own (``unshare --uts``, which
needs root), running ``shardtop run --run-dir SHARED -- torchrun …``; torchrun's c10d rendezvous joins them
over loopback, as a job over two machines with a shared file system.  Used by
tests/engines/test_own_job_hosts.py, and how ``tests/fixtures/runs/cpu-2hosts/`` was recorded
(``record_two_hosts.py``)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from shardtop.rundir.run_members import read_members
from tests.support.cli import ROOT
from tests.support.distributed import free_port
from tests.support.own_job_runs import SCRIPTS, user_env

HOSTS = ("node-a", "node-b")
SLURM = {"SLURM_JOB_ID": "4242", "SLURM_STEP_ID": "0"}
"""What srun would set for the job's step on each node (SLURMD_NODENAME per node)."""


def unshare_refused() -> str | None:
    try:
        done = subprocess.run(["unshare", "--uts", "sh", "-c", "hostname shardtop-test && hostname"],
                              capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"unshare is not available here ({e})"
    if done.returncode != 0 or done.stdout.strip() != "shardtop-test":
        return f"unshare --uts is not permitted here (it needs root): {done.stderr.strip()}"
    return None


def run_two_hosts(
    shared: Path, *script_args: str, os_exit: bool = True, timeout: float = 240
) -> tuple[list[str], list[int]]:
    """``shardtop run --run-dir SHARED -- torchrun … fsdp2_train.py`` on each of ``HOSTS``: outputs and exit codes.

    ``os_exit``: the ranks leave with ``os._exit`` (no gloo teardown abort, and no exit event either).

    Also how ``tests/fixtures/runs/cpu-2hosts/`` was recorded (``tests/support/record_two_hosts.py``).
    """
    port = free_port()
    procs = []
    for node_rank, host in enumerate(HOSTS):
        command = [
            "unshare", "--uts", "sh", "-c", f'hostname {host} && exec "$0" "$@"',
            sys.executable, "-m", "shardtop", "run", "--headless", "--run-dir", str(shared), "--",
            "torchrun", "--nnodes", "2", "--node_rank", str(node_rank), "--nproc_per_node", "2",
            "--rdzv_backend", "c10d", "--rdzv_endpoint", f"127.0.0.1:{port}", "--local_addr", "127.0.0.1",
            "--max_restarts", "0", str(SCRIPTS / "fsdp2_train.py"), *(["--os-exit"] if os_exit else []), *script_args,
        ]
        env = user_env(**SLURM, SLURMD_NODENAME=host)
        procs.append(subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                      text=True, cwd=ROOT))
    outputs, codes = [], []
    try:
        for proc in procs:
            out, _ = proc.communicate(timeout=timeout)
            outputs.append(out)
            codes.append(proc.returncode)
    finally:
        for member in read_members(shared):  # the supervisors are detached: end what this test started
            if member.kind == "supervisor" and member.ended is None:
                try:
                    os.killpg(member.pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
        for proc in procs:
            proc.kill()
    return outputs, codes
