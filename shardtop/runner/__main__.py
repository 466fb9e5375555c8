"""``python -m shardtop.runner``: the supervisor (``RUN_DIR``), a rank (``--rank N``), or
the launcher's short-lived intermediate (``--detach RUN_DIR``)."""

from __future__ import annotations

import argparse
import os
from pathlib import Path


def detach(run_dir: Path) -> int:
    """Fork the supervisor into a session of its own, print its pid, and leave at once.

    The launcher reaps this process right away; the supervisor, orphaned, is
    re-parented to init (or the nearest subreaper), so the launcher never has
    a child to collect.  The supervisor waits for the launcher to close its
    stdin (the pid is recorded by then) before it starts any rank.
    """
    if os.fork():
        os._exit(0)
    os.setsid()  # leads a new session and process group: pgid == pid
    print(os.getpid(), flush=True)
    os.dup2(2, 1)  # from here on, stdout goes to runner.log like stderr
    while os.read(0, 4096):  # the launcher's go: EOF once run.json names us
        pass
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    from shardtop.runner.supervisor import supervise

    return supervise(run_dir)


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m shardtop.runner")
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--rank", type=int, default=None)
    parser.add_argument("--detach", action="store_true", help="start the supervisor detached (the launcher's way)")
    args = parser.parse_args()
    if args.detach:
        return detach(args.run_dir)
    if args.rank is None:
        from shardtop.runner.supervisor import supervise

        return supervise(args.run_dir)
    from shardtop.runner.rank import run_rank

    return run_rank(args.run_dir, args.rank)


raise SystemExit(main())
