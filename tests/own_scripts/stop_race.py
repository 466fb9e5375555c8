"""A user's two-rank gloo loop whose ranks react to a stop unevenly (nothing of shardtop in it).

    torchrun --nproc_per_node 2 tests/own_scripts/stop_race.py [--fail-at N]

Rank 1 dies at once of SIGTERM; rank 0 is deep in a collective that goes on (it ignores SIGTERM), so it
fails a moment later with gloo's "connection closed by peer".  ``--fail-at N``: rank 1 raises an error
of its own at step N instead, with no stop at all.
"""

from __future__ import annotations

import argparse
import signal
import time

import torch
import torch.distributed as dist


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--fail-at", type=int, default=0)
    args = parser.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    if rank == 0:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    model = torch.nn.Linear(16, 16)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    for step in range(1, 10_000):
        model(torch.randn(4, 16)).sum().backward()
        if rank == 1 and step == args.fail_at:
            raise RuntimeError("a bug of the script's own on rank 1")
        for p in model.parameters():
            dist.all_reduce(p.grad)
        optimizer.step()
        optimizer.zero_grad()
        time.sleep(0.2)


if __name__ == "__main__":
    main()
