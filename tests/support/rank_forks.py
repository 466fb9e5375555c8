"""Rank processes forked from one that imported torch once, for ``run_ranks``.

Each rank ``run_ranks`` starts is a process of its own that imports torch
(about 2 CPU-seconds on a 2-core machine) before its test function runs; the
engines' layer starts about seventy.  A fork server imports torch (and
nothing of shardtop or of the tests) once per test process and forks a rank
for each request: the child takes the rank's environment, working directory
and log, and runs ``tests.support.distributed`` as ``python -m`` would.  Each
rank is still a real process of its own, with its own gloo connection, its
own allocator and limits; only the import of torch is shared.

The server is single-threaded at the moment it forks (``import torch`` starts
no thread), and runs one request at a time: its ranks are forked together and
waited for together, each killed past the request's timeout.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
PRELOADED = ("torch", "torch.distributed")
"""What the server imports before it forks: what every rank's test module imports first anyway."""
SERVER_ENV = {"OMP_NUM_THREADS": "1", "DS_ACCELERATOR": "cpu"}
"""Read once, where torch's OpenMP runtime loads: every rank of ``run_ranks`` runs with these."""


class RankForks:
    """The client: one server per test process, started at its first request."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._server: subprocess.Popen[str] | None = None

    def run(self, argv: list[str], ranks: list[tuple[dict[str, str], Path]], timeout: float) -> list[int | None]:
        """Each rank's exit code (None: killed past ``timeout``) for ``python -m tests.support.distributed argv``
        run once per ``(environment, log)``, all at once."""
        with self._lock:
            server = self._started()
            request = {"argv": argv, "ranks": [{"env": env, "log": str(log)} for env, log in ranks], "timeout": timeout}
            assert server.stdin is not None and server.stdout is not None
            server.stdin.write(json.dumps(request) + "\n")
            server.stdin.flush()
            line = server.stdout.readline()
            if not line:
                self._server = None
                raise RuntimeError(f"the rank fork server ended (exit {server.wait()})")
            codes: list[int | None] = json.loads(line)["codes"]
            return codes

    def _started(self) -> subprocess.Popen[str]:
        if self._server is None or self._server.poll() is not None:
            env = {**os.environ, **SERVER_ENV,
                   "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
            self._server = subprocess.Popen(
                [sys.executable, "-m", "tests.support.rank_forks"], env=env, cwd=ROOT, text=True,
                stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            )
        return self._server


def usable(env: dict[str, str]) -> bool:
    """Whether a rank with this environment can be forked: the variables the server read once agree."""
    return all(env.get(k) == v for k, v in SERVER_ENV.items())


# -- the server ---------------------------------------------------------------------------------------


def _fork_rank(argv: list[str], env: dict[str, str], log: str) -> int:
    pid = os.fork()
    if pid:
        return pid
    try:  # the child: become ``python -m tests.support.distributed argv`` in the rank's environment
        os.setpgid(0, 0)
        os.environ.clear()
        os.environ.update(env)
        os.chdir(ROOT)
        fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        os.close(fd)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.close(null)
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        sys.argv = ["tests.support.distributed", *argv]
        from tests.support.distributed import _main

        _main()  # leaves with os._exit
    finally:
        os._exit(1)


def _wait_all(pids: list[int], timeout: float) -> list[int | None]:
    codes: dict[int, int | None] = {}
    deadline = time.monotonic() + timeout
    while len(codes) < len(pids):
        for pid in pids:
            if pid in codes:
                continue
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                codes[pid] = os.waitstatus_to_exitcode(status)
        if len(codes) < len(pids) and time.monotonic() > deadline:
            for pid in pids:
                if pid not in codes:
                    os.killpg(pid, signal.SIGKILL)
                    os.waitpid(pid, 0)
                    codes[pid] = None
        time.sleep(0.02)
    return [codes[pid] for pid in pids]


def serve() -> None:
    for name in PRELOADED:
        __import__(name)
    for line in sys.stdin:
        request: dict[str, Any] = json.loads(line)
        sys.stdout.flush()
        pids = [_fork_rank(request["argv"], rank["env"], rank["log"]) for rank in request["ranks"]]
        sys.stdout.write(json.dumps({"codes": _wait_all(pids, request["timeout"])}) + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    serve()
