"""A user's plain loop that keeps every step's logits in a list, under a cap it sets itself: memory grows
by the logits' size each step until the rank runs out.  Nothing of shardtop in it.

    shardtop run --headless -- python gpu/scenarios/kept_logits.py --cap-gib 24

A small language model (embedding, two MLP blocks, a head over a vocabulary of 32 000) on 4 sequences
of 512 tokens: each step's float32 logits are 4 x 512 x 32 000 x 4 B = 250 MiB, appended "for the
metrics later".  ``torch.cuda.set_per_process_memory_fraction`` caps the process at ``--cap-gib``;
the run ends in a CUDA out-of-memory error after about cap / 250 MiB steps.
"""

from __future__ import annotations

import argparse
import sys

import torch
from torch import nn

GiB = 1 << 30


class Lm(nn.Module):
    def __init__(self, vocab: int, width: int) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.blocks = nn.Sequential(*(nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))
                                      for _ in range(2)))
        self.head = nn.Linear(width, vocab)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.head(self.blocks(self.embed(ids)))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--cap-gib", type=float, default=24.0)
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--vocab", type=int, default=32000)
    parser.add_argument("--width", type=int, default=1024)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("kept_logits.py needs a CUDA GPU", file=sys.stderr)
        sys.exit(2)
    device = torch.device("cuda", 0)
    total = torch.cuda.get_device_properties(device).total_memory
    torch.cuda.set_per_process_memory_fraction(min(1.0, args.cap_gib * GiB / total), device)
    torch.manual_seed(0)
    model = Lm(args.vocab, args.width).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    history = []  # "for the metrics later": every step's logits stay alive
    for step in range(args.steps):
        ids = torch.randint(0, args.vocab, (4, 512), device=device)
        logits = model(ids)
        loss = nn.functional.cross_entropy(logits.view(-1, args.vocab), ids.view(-1))
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        history.append(logits.detach())
        if step % 10 == 0:
            print(f"step {step}: {torch.cuda.memory_allocated(device) / GiB:.2f} GiB allocated", flush=True)


if __name__ == "__main__":
    main()
