"""A user's plain training loop with no engine, calling its model with keyword arguments alone, as
transformers' models are called (``model(input_ids=..., labels=...)``).  Nothing of shardtop in it.

    python tests/own_scripts/keyword_loop.py --steps 3
"""

from __future__ import annotations

import argparse

import torch
from hf_tiny import Tokens, tiny_llama

BATCH = 4


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=3)
    steps = parser.parse_args().steps
    torch.set_num_threads(1)
    model = tiny_llama()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    tokens = Tokens()
    for step in range(steps):
        ids = torch.stack([tokens[(step * BATCH + i) % len(tokens)]["input_ids"] for i in range(BATCH)])
        model(input_ids=ids, labels=ids).loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    print(f"final steps={steps}", flush=True)


if __name__ == "__main__":
    main()
