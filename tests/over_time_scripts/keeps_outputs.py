"""A user's plain training loop that keeps every step's outputs in a list (nothing of shardtop in it).

    python tests/over_time_scripts/keeps_outputs.py [--hook] [--plateau adam|cache|batches] [--steps 30]

``--hook``: a forward hook on one layer appends its activations instead (feature-extraction code does
this).  ``--plateau``: memory that rises and then stops, which is no growth: Adam's state made at step
1, a cache filled over the first steps, batches that grow for a few steps and then stay.
"""

from __future__ import annotations

import argparse

import torch
from torch import nn


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--hook", action="store_true")
    parser.add_argument("--plateau", choices=("adam", "cache", "batches"))
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--width", type=int, default=8192)
    args = parser.parse_args()
    torch.manual_seed(0)
    if args.hook:  # the wide activations are in the middle, where the hook takes them
        model = nn.Sequential(nn.Linear(64, args.width), nn.ReLU(), nn.Linear(args.width, 64))
    else:  # the wide tensor is the output, which the loop keeps
        model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, args.width))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    kept: list[torch.Tensor] = []
    cache: dict[int, torch.Tensor] = {}
    if args.hook:
        model[1].register_forward_hook(lambda module, inputs, output: kept.append(output.detach()))
    for step in range(args.steps):
        batch = args.batch
        if args.plateau == "batches":
            batch = args.batch * min(step + 1, 4)
        x = torch.randn(batch, 64)
        out = model(x)
        loss = out.pow(2).mean()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        if args.plateau == "cache" and len(cache) < 4:
            cache[step] = torch.randn(args.batch, args.width)
        if not args.hook and args.plateau is None:
            kept.append(out.detach())  # "for the metrics later": every step's outputs stay
    print(f"done: {len(kept)} kept tensors")


if __name__ == "__main__":
    main()
