"""Run a test function on N real gloo ranks, each in its own process.

``run_ranks("tests.support.shard_workers:fsdp1_full_shard", 2, tmp_path, n_layers=4)``
runs ``tests.support.distributed`` once per rank with the usual torch distributed
environment, each rank a process forked from one that imported torch once
(``rank_forks.py``), or a ``python`` of its own where ``env`` changes what that
process read at its start; each rank calls the function with ``rank``,
``world_size``, ``out_dir`` and the keyword arguments, and whatever the
function returns (JSON-able) comes back, one entry per rank.

Ranks leave with ``os._exit`` after writing their result: raw gloo runs abort
at interpreter exit now and then (``own_job_runs.GLOO_TEARDOWN_ABORT``), which must not fail a test.
"""

from __future__ import annotations

import importlib
import json
import os
import socket
import subprocess
import sys
from datetime import timedelta
from pathlib import Path
from typing import Any

from tests.support.rank_forks import RankForks, usable

ROOT = Path(__file__).resolve().parents[2]
FORKS = RankForks()
"""Where the ranks come from: forks of a process that imported torch once (``rank_forks.py``)."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_ranks(
    target: str,
    world_size: int,
    out_dir: Path,
    timeout: float = 300,
    env: dict[str, str] | None = None,
    **kwargs: Any,
) -> list[Any]:
    """Results of ``target`` on every rank; raises with the ranks' output if one failed."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    port = str(free_port())
    envs = [
        {
            **os.environ,
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": port,
            "RANK": str(rank),
            "LOCAL_RANK": str(rank),
            "WORLD_SIZE": str(world_size),
            "LOCAL_WORLD_SIZE": str(world_size),
            "DS_ACCELERATOR": "cpu",
            "OMP_NUM_THREADS": "1",
            "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
            **(env or {}),
        }
        for rank in range(world_size)
    ]
    argv = [target, str(out_dir), json.dumps(kwargs)]
    logs = [out_dir / f"rank-{rank}.out" for rank in range(world_size)]
    if all(usable(e) for e in envs):
        codes = FORKS.run(argv, list(zip(envs, logs, strict=True)), timeout)
        failed = [rank for rank, code in enumerate(codes) if code is None]
    else:
        failed = _started_fresh(argv, envs, logs, timeout)
    results = []
    for rank in range(world_size):
        path = out_dir / f"rank-{rank}.result.json"
        if not path.exists():
            failed.append(rank)
            continue
        results.append(json.loads(path.read_text()))
    if failed:
        logs = "\n".join(
            f"--- rank {r} ---\n{(out_dir / f'rank-{r}.out').read_text()[-4000:]}" for r in sorted(set(failed))
        )
        raise AssertionError(f"ranks {sorted(set(failed))} of {target} failed:\n{logs}")
    return results


def _started_fresh(argv: list[str], envs: list[dict[str, str]], logs: list[Path], timeout: float) -> list[int]:
    """Each rank a ``python`` of its own (an environment the fork server cannot give); the ranks past ``timeout``."""
    procs = []
    for rank_env, path in zip(envs, logs, strict=True):
        with open(path, "w") as log:
            procs.append(subprocess.Popen([sys.executable, "-m", "tests.support.distributed", *argv], env=rank_env,
                                          stdout=log, stderr=subprocess.STDOUT, cwd=ROOT))
    failed = []
    for rank, proc in enumerate(procs):
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            for p in procs:
                p.kill()
            failed.append(rank)
    return failed


PEERS_WAITED = timedelta(seconds=60)


def _wait_for_every_rank() -> None:
    """Leave only once every rank is done: a rank that left at once closed its sockets while a peer could still
    be connecting to it (gloo pairs up each new group, a device mesh's last), and the peer failed with ``Broken
    pipe``.  A peer that failed and left ends the wait at once (its sockets closed), one that hangs after
    ``PEERS_WAITED``; a group that cannot wait so (not gloo's, or none) is left as it is."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return
    try:
        dist.monitored_barrier(timeout=PEERS_WAITED)
    except Exception:  # noqa: BLE001 - a peer that failed says so in its own output
        pass


def _main() -> None:
    target, out_dir, kwargs = sys.argv[1], Path(sys.argv[2]), json.loads(sys.argv[3])
    module_name, _, func_name = target.partition(":")
    func = getattr(importlib.import_module(module_name), func_name)
    rank = int(os.environ["RANK"])
    world_size = int(os.environ["WORLD_SIZE"])
    code = 0
    try:
        result = func(rank=rank, world_size=world_size, out_dir=out_dir, **kwargs)
        (out_dir / f"rank-{rank}.result.json").write_text(json.dumps(result))
        _wait_for_every_rank()
    except BaseException:
        import traceback

        traceback.print_exc()
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    _main()
