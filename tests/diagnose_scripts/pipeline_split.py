"""A model split by hand over two processes, by layer count, not by bytes.

Each rank builds the whole model on the meta device and materialises only its
stage, as hand-rolled pipeline parallelism does: rank 0 the embedding and the
first half of the layers, rank 1 the second half and the classifier.  The
embedding of a 32 000-token vocabulary outweighs every layer together, so rank 0
holds most of the model and rank 1 little.  Activations go forward and
gradients back with ``send``/``recv``.

    torchrun --nproc-per-node 2 tests/diagnose_scripts/pipeline_split.py
"""

from __future__ import annotations

import argparse

import torch
import torch.distributed as dist
from torch import nn

import shardtop.probe as st


class TextClassifier(nn.Module):
    def __init__(self, vocab: int, dim: int, depth: int, classes: int) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.layers = nn.ModuleList(
            nn.Sequential(nn.LayerNorm(dim), nn.Linear(dim, 2 * dim), nn.GELU(), nn.Linear(2 * dim, dim))
            for _ in range(depth)
        )
        self.head = nn.Linear(dim, classes)


def stage_modules(model: TextClassifier, rank: int) -> list[nn.Module]:
    half = len(model.layers) // 2
    if rank == 0:
        return [model.embed, *model.layers[:half]]
    return [*model.layers[half:], model.head]


def materialise(modules: list[nn.Module]) -> None:
    for module in modules:
        module.to_empty(device="cpu")
        for sub in module.modules():
            if hasattr(sub, "reset_parameters"):
                sub.reset_parameters()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--vocab", type=int, default=32000)
    parser.add_argument("--dim", type=int, default=128)
    parser.add_argument("--depth", type=int, default=4)
    parser.add_argument("--steps", type=int, default=2)
    args = parser.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    with st.watch(name="pipeline-split"):
        with torch.device("meta"):
            model = TextClassifier(args.vocab, args.dim, args.depth, classes=4)
        mine = stage_modules(model, rank)
        materialise(mine)
        params = [p for m in mine for p in m.parameters()]
        optimizer = torch.optim.SGD(params, lr=1e-2)
        st.attach(model, optimizer=optimizer, strategy="pipeline by hand (send/recv)")
        half = len(model.layers) // 2
        shape = (8, 16, args.dim)
        for step in range(1, args.steps + 1):
            st.phase("forward", step)
            if rank == 0:
                x = model.embed(torch.randint(0, args.vocab, shape[:2]))
                for layer in model.layers[:half]:
                    x = x + layer(x)
                dist.send(x.detach(), 1)
                st.phase("backward")
                grad = torch.empty(shape)
                dist.recv(grad, 1)
                x.backward(grad)
                loss = None
            else:
                x = torch.empty(shape)
                dist.recv(x, 0)
                x.requires_grad_()
                h = x
                for layer in model.layers[half:]:
                    h = h + layer(h)
                loss = nn.functional.cross_entropy(model.head(h.mean(1)), torch.randint(0, 4, (shape[0],)))
                st.phase("backward")
                loss.backward()
                dist.send(x.grad, 0)
            st.phase("optimizer")
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            st.step(step, loss=loss.item() if loss is not None else None)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
