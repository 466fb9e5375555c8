"""A loss whose ``autograd.Function`` saves a parameter and reads an attribute of it in backward.

It is what TRL's chunked log-prob loss and Liger's fused linear cross-entropy
do (they read ``weight.ds_status`` under ZeRO-3 to gather the weight again),
and what bitsandbytes does with the ``quant_state`` it sets on its 4-bit
weights: the projection to the vocabulary and the loss are one function, so
the logits are never kept, and the backward recomputes them from the saved
hidden states and the saved weight, the ``Parameter`` itself.

Run under ``torchrun --nproc_per_node 2`` on CPU (gloo):
``--engine ddp`` (a plain attribute on the weight, as bitsandbytes sets one)
or ``--engine zero3`` (DeepSpeed ZeRO-3 with ``DS_ACCELERATOR=cpu``; the
weight's ``ds_status``).  Rank 0 prints ``final steps=N loss=X``.
"""

from __future__ import annotations

import argparse
import contextlib
import os
from collections.abc import Iterator
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

HIDDEN = 32
VOCAB = 96
TOKENS = 16
STEPS = 4
QUANT_STATE = "fp32, unquantised"


@contextlib.contextmanager
def gathered(weight: nn.Parameter, zero3: bool) -> Iterator[None]:
    """The weight whole for the duration, as TRL gathers its head under ZeRO-3 (reads ``ds_status``);
    elsewhere, the weight as bitsandbytes reads its own (reads ``quant_state``)."""
    if not zero3:
        assert weight.quant_state == QUANT_STATE  # type: ignore[attr-defined]
        yield
        return
    import deepspeed
    from deepspeed.runtime.zero.partition_parameters import ZeroParamStatus

    if weight.ds_status == ZeroParamStatus.AVAILABLE:  # type: ignore[attr-defined]
        yield
        return
    with deepspeed.zero.GatheredParameters([weight]):
        yield


class LinearCrossEntropy(torch.autograd.Function):
    """``cross_entropy(hidden @ weight.T, targets)`` with the logits made again in backward."""

    @staticmethod
    def forward(
        ctx: Any, hidden: torch.Tensor, weight: nn.Parameter, targets: torch.Tensor, zero3: bool
    ) -> torch.Tensor:
        with gathered(weight, zero3):
            loss = nn.functional.cross_entropy(hidden @ weight.t(), targets)
        ctx.save_for_backward(hidden, weight, targets)
        ctx.zero3 = zero3
        return loss

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, None, None]:
        hidden, weight, targets = ctx.saved_tensors
        with gathered(weight, ctx.zero3):
            logits = hidden @ weight.t()
            probs = torch.softmax(logits, dim=-1)
            probs[torch.arange(len(targets)), targets] -= 1
            probs *= grad / len(targets)
            return probs @ weight, probs.t() @ hidden, None, None


class TinyLM(nn.Module):
    def __init__(self, zero3: bool) -> None:
        super().__init__()
        self.zero3 = zero3
        self.embed = nn.Embedding(VOCAB, HIDDEN)
        self.body = nn.Sequential(nn.Linear(HIDDEN, HIDDEN), nn.Tanh(), nn.Linear(HIDDEN, HIDDEN))
        self.head = nn.Linear(HIDDEN, VOCAB, bias=False)

    def forward(self, tokens: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        hidden = self.body(self.embed(tokens))
        loss: torch.Tensor = LinearCrossEntropy.apply(hidden, self.head.weight, targets, self.zero3)
        return loss


def batch(step: int, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(1000 * step + rank)
    tokens = torch.randint(0, VOCAB, (TOKENS,), generator=generator)
    return tokens, torch.roll(tokens, -1)


def train_ddp() -> float:
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = TinyLM(zero3=False)
    model.head.weight.quant_state = QUANT_STATE  # type: ignore[attr-defined]
    ddp = nn.parallel.DistributedDataParallel(model)
    optimizer = torch.optim.AdamW(ddp.parameters(), lr=1e-2)
    loss = torch.zeros(())
    for step in range(STEPS):
        loss = ddp(*batch(step, dist.get_rank()))
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    return float(loss)


def train_zero3() -> float:
    import deepspeed

    deepspeed.init_distributed("gloo")
    config = {"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 3},
              "zero_allow_untested_optimizer": True, "steps_per_print": 10**9}
    torch.manual_seed(0)
    with deepspeed.zero.Init(config_dict_or_path=config):
        model = TinyLM(zero3=True)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    engine, *_ = deepspeed.initialize(model=model, optimizer=optimizer, config=config)
    loss = torch.zeros(())
    for step in range(STEPS):
        loss = engine(*batch(step, dist.get_rank()))
        engine.backward(loss)
        engine.step()
    return float(loss)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--engine", choices=("ddp", "zero3"), required=True)
    args = parser.parse_args()
    torch.set_num_threads(1)
    loss = train_ddp() if args.engine == "ddp" else train_zero3()
    if int(os.environ.get("RANK", "0")) == 0:
        print(f"final steps={STEPS} loss={loss!r}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
