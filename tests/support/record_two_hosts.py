"""Record a real two-host run on one machine, as ``tests/fixtures/runs/cpu-2hosts/`` was recorded.

    python -m tests.support.record_two_hosts tests/fixtures/runs/cpu-2hosts/RUN_ID [--steps N]

Two "hosts" (``node-a``, ``node-b``: UTS namespaces, which needs root), each
running ``shardtop run --run-dir RUN_DIR -- torchrun … fsdp2_train.py`` with two
CPU ranks, joined by torchrun's c10d rendezvous over loopback: the run directory
is what a job over two machines with a shared file system leaves.  The same
helper starts the two-host test (``tests/engines/test_own_job_hosts.py``).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from tests.support.two_hosts import run_two_hosts, unshare_refused


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run_dir", type=Path, help="the run directory to make (it must not exist yet)")
    parser.add_argument("--steps", type=int, default=20, help="training steps of fsdp2_train.py")
    args = parser.parse_args()
    refused = unshare_refused()
    if refused:
        print(refused, file=sys.stderr)
        return 2
    if args.run_dir.exists():
        print(f"{args.run_dir} exists already: give a new directory.", file=sys.stderr)
        return 2
    args.run_dir.parent.mkdir(parents=True, exist_ok=True)
    outputs, codes = run_two_hosts(args.run_dir.resolve(), "--steps", str(args.steps), os_exit=False)
    for host_output in outputs:
        print(host_output)
    return 0 if codes == [0, 0] else 1


if __name__ == "__main__":
    raise SystemExit(main())
