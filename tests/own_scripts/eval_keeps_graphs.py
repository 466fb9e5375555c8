"""A user's evaluation loop that keeps each batch's logits for a metric computed at the end, without
``torch.no_grad()``: every kept tensor holds its forward's whole autograd graph, and memory climbs by a
forward's activations at every batch until the process runs out.  Nothing of shardtop in it.

``--no-grad``: the same loop under ``torch.no_grad()`` (only the logits are kept).  ``--cap-mib N``: the
process may allocate at most N MiB more than at its start (its data segment, ``RLIMIT_DATA``): a stand-in
for a small GPU.  ``--cuda --cap-gib N``: on the GPU, capped with ``set_per_process_memory_fraction``;
``--dim``, ``--hidden``, ``--vocab`` and ``--tokens`` size it.

    python tests/own_scripts/eval_keeps_graphs.py --cap-mib 300
    python tests/own_scripts/eval_keeps_graphs.py --cuda --cap-gib 20 --dim 2048 --hidden 8192 --tokens 4096
"""

from __future__ import annotations

import argparse
import contextlib
import resource

import torch
from torch import nn


class Block(nn.Module):
    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.up = nn.Linear(dim, hidden)
        self.down = nn.Linear(hidden, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(torch.nn.functional.gelu(self.up(x)))


class TinyLM(nn.Module):
    def __init__(self, vocab: int, dim: int, hidden: int, blocks: int = 4) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.blocks = nn.Sequential(*(Block(dim, hidden) for _ in range(blocks)))
        self.head = nn.Linear(dim, vocab)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.head(self.blocks(self.embed(tokens)))


def data_segment() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmData:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmData")


def evaluate(model: nn.Module, batches: int, no_grad: bool, vocab: int, tokens_per_batch: int) -> float:
    outputs = []
    device = next(model.parameters()).device
    for index in range(batches):
        generator = torch.Generator().manual_seed(index)
        tokens = torch.randint(0, vocab, (8, tokens_per_batch // 8), generator=generator).to(device)
        with torch.no_grad() if no_grad else contextlib.nullcontext():
            logits = model(tokens)
        outputs.append(logits)  # kept for the metric below
    return float(torch.stack([o.float().mean() for o in outputs]).mean())


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--batches", type=int, default=40)
    parser.add_argument("--no-grad", action="store_true")
    parser.add_argument("--cap-mib", type=int, default=0)
    parser.add_argument("--cuda", action="store_true")
    parser.add_argument("--cap-gib", type=float, default=0.0)
    parser.add_argument("--vocab", type=int, default=512)
    parser.add_argument("--dim", type=int, default=256)
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--tokens", type=int, default=512)
    args = parser.parse_args()
    torch.manual_seed(0)
    model = TinyLM(args.vocab, args.dim, args.hidden)
    if args.cuda:
        model = model.cuda()
        if args.cap_gib:
            total = torch.cuda.get_device_properties(0).total_memory
            torch.cuda.set_per_process_memory_fraction(args.cap_gib * 2**30 / total)
    elif args.cap_mib:
        _, hard = resource.getrlimit(resource.RLIMIT_DATA)
        resource.setrlimit(resource.RLIMIT_DATA, (data_segment() + (args.cap_mib << 20), hard))
    mean = evaluate(model, args.batches, args.no_grad, args.vocab, args.tokens)
    print(f"mean logit {mean:.6f}", flush=True)


if __name__ == "__main__":
    main()
