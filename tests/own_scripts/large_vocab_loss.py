"""A user's training loop whose loss upcasts the logits of a large vocabulary to fp32: the fp32 copy of
batch × sequence × vocabulary values is what no longer fits.  Nothing of shardtop in it.

``--vocab 1024``: the same loop with a small vocabulary (the logits are small).  ``--cap-mib N``: the
process may allocate at most N MiB more than at its start (its data segment): a stand-in for a small GPU.
``--cuda --cap-gib N``: on the GPU, capped with ``set_per_process_memory_fraction``; ``--seq`` and ``--dim``
(and ``--batch``) size it.

    python tests/own_scripts/large_vocab_loss.py --cap-mib 150
    python tests/own_scripts/large_vocab_loss.py --cuda --cap-gib 20 --vocab 256000 --seq 2048 --dim 1024
"""

from __future__ import annotations

import argparse
import resource
import time

import torch
from torch import nn


class TinyLM(nn.Module):
    def __init__(self, vocab: int, dim: int = 64) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.mix = nn.Linear(dim, dim)
        self.lm_head = nn.Linear(dim, vocab, bias=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.lm_head(torch.relu(self.mix(self.embed(tokens))))


def data_segment() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmData:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmData")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--vocab", type=int, default=32768)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--cap-mib", type=int, default=0)
    parser.add_argument("--cuda", action="store_true")
    parser.add_argument("--cap-gib", type=float, default=0.0)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--seq", type=int, default=256)
    parser.add_argument("--dim", type=int, default=64)
    args = parser.parse_args()
    torch.manual_seed(0)
    device = torch.device("cuda" if args.cuda else "cpu")
    model = TinyLM(args.vocab, args.dim).to(device, torch.bfloat16)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    if args.cuda and args.cap_gib:
        total = torch.cuda.get_device_properties(0).total_memory
        torch.cuda.set_per_process_memory_fraction(args.cap_gib * 2**30 / total)
    elif args.cap_mib:
        _, hard = resource.getrlimit(resource.RLIMIT_DATA)
        resource.setrlimit(resource.RLIMIT_DATA, (data_segment() + (args.cap_mib << 20), hard))
    started = time.perf_counter()
    for step in range(1, args.steps + 1):
        generator = torch.Generator().manual_seed(step)
        tokens = torch.randint(0, args.vocab, (args.batch, args.seq + 1), generator=generator).to(device)
        logits = model(tokens[:, :-1])
        loss = nn.functional.cross_entropy(logits.float().reshape(-1, args.vocab), tokens[:, 1:].reshape(-1))
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        print(f"step {step} loss {loss.item():.4f}", flush=True)
    print(f"loop seconds {time.perf_counter() - started:.4f}", flush=True)


if __name__ == "__main__":
    main()
