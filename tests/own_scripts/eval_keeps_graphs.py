"""A user's evaluation loop that keeps each batch's logits for a metric computed at the end, without
``torch.no_grad()``: every kept tensor holds its forward's whole autograd graph, and memory climbs by a
forward's activations at every batch until the process runs out.  Nothing of shardtop in it.

``--no-grad``: the same loop under ``torch.no_grad()`` (only the logits are kept).  ``--cap-mib N``: the
process may allocate at most N MiB more than at its start (its data segment, ``RLIMIT_DATA``): a stand-in
for a small GPU.

    python tests/own_scripts/eval_keeps_graphs.py --cap-mib 160
"""

from __future__ import annotations

import argparse
import contextlib
import resource

import torch
from torch import nn

VOCAB, DIM, HIDDEN, TOKENS = 512, 256, 1024, 8 * 64


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.up = nn.Linear(DIM, HIDDEN)
        self.down = nn.Linear(HIDDEN, DIM)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(torch.nn.functional.gelu(self.up(x)))


class TinyLM(nn.Module):
    def __init__(self, blocks: int = 4) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, DIM)
        self.blocks = nn.Sequential(*(Block() for _ in range(blocks)))
        self.head = nn.Linear(DIM, VOCAB)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.head(self.blocks(self.embed(tokens)))


def data_segment() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmData:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmData")


def evaluate(model: nn.Module, batches: int, no_grad: bool) -> float:
    outputs = []
    for index in range(batches):
        tokens = torch.randint(0, VOCAB, (8, 64), generator=torch.Generator().manual_seed(index))
        with torch.no_grad() if no_grad else contextlib.nullcontext():
            logits = model(tokens)
        outputs.append(logits)  # kept for the metric below
    return float(torch.stack([o.float().mean() for o in outputs]).mean())


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--batches", type=int, default=40)
    parser.add_argument("--no-grad", action="store_true")
    parser.add_argument("--cap-mib", type=int, default=0)
    args = parser.parse_args()
    torch.manual_seed(0)
    model = TinyLM()
    if args.cap_mib:
        _, hard = resource.getrlimit(resource.RLIMIT_DATA)
        resource.setrlimit(resource.RLIMIT_DATA, (data_segment() + (args.cap_mib << 20), hard))
    print(f"mean logit {evaluate(model, args.batches, args.no_grad):.6f}", flush=True)


if __name__ == "__main__":
    main()
