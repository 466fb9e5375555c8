from __future__ import annotations

import argparse
from pathlib import Path


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m shardtop.runner")
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--rank", type=int, default=None)
    args = parser.parse_args()
    if args.rank is None:
        from shardtop.runner.supervisor import supervise

        return supervise(args.run_dir)
    from shardtop.runner.rank import run_rank

    return run_rank(args.run_dir, args.rank)


raise SystemExit(main())
