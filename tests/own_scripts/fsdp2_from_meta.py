"""A user's FSDP2 script that applies ``fully_shard`` as torchtitan does: the model is built on the meta
device, each block wrapped for activation checkpointing, then ``fully_shard`` on the embeddings, on each
block, on ``[norm, output]`` together and on the root (which owns no parameter of its own); only then
materialised and initialised.  Nothing of shardtop in it.

    torchrun --nproc_per_node 2 tests/own_scripts/fsdp2_from_meta.py
"""

from __future__ import annotations

import argparse

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

DIM, VOCAB = 64, 256


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.attention_norm = nn.LayerNorm(DIM)
        self.feed_forward = nn.Sequential(nn.Linear(DIM, 4 * DIM), nn.GELU(), nn.Linear(4 * DIM, DIM))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.feed_forward(self.attention_norm(x))


class Transformer(nn.Module):
    def __init__(self, layers: int) -> None:
        super().__init__()
        self.tok_embeddings = nn.Embedding(VOCAB, DIM)
        self.layers = nn.ModuleDict({str(i): Block() for i in range(layers)})
        self.norm = nn.LayerNorm(DIM)
        self.output = nn.Linear(DIM, VOCAB, bias=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.tok_embeddings(tokens)
        for layer in self.layers.values():
            x = layer(x)
        return self.output(self.norm(x))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--steps", type=int, default=3)
    args = parser.parse_args()
    dist.init_process_group("gloo")
    mesh = init_device_mesh("cpu", (dist.get_world_size(),), mesh_dim_names=("dp_shard",))
    with torch.device("meta"):
        model = Transformer(args.layers)
    for name, block in list(model.layers.named_children()):
        model.layers.register_module(name, checkpoint_wrapper(block))
    fully_shard(model.tok_embeddings, mesh=mesh)
    for block in model.layers.values():
        fully_shard(block, mesh=mesh)
    fully_shard([model.norm, model.output], mesh=mesh)
    fully_shard(model, mesh=mesh)
    model.to_empty(device="cpu")
    torch.manual_seed(0)
    with torch.no_grad():
        for param in model.parameters():
            param.normal_(0.0, 0.02)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    tokens = torch.randint(0, VOCAB, (4, 32), generator=torch.Generator().manual_seed(dist.get_rank()))
    for step in range(1, args.steps + 1):
        logits = model(tokens[:, :-1])
        loss = nn.functional.cross_entropy(logits.reshape(-1, VOCAB), tokens[:, 1:].reshape(-1))
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        if dist.get_rank() == 0:
            print(f"step {step} loss {loss.item():.6f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
