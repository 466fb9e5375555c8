"""A user's own accelerate training loop: nothing of shardtop in it.

A tiny Llama built from its config (``hf_tiny.py``), synthetic tokens, three
steps, for ``accelerate launch`` with the FSDP or the DeepSpeed plugin:

    accelerate launch --config_file tests/own_scripts/accelerate_zero3.yaml --num_processes 2 \\
        tests/own_scripts/accelerate_train.py --lora
    accelerate launch --config_file tests/own_scripts/accelerate_fsdp2.yaml --num_processes 2 \\
        tests/own_scripts/accelerate_train.py --cuda

Without ``--cuda`` the ranks are CPU processes over gloo (``DS_ACCELERATOR=cpu``
for DeepSpeed), set up as ``Trainer(use_cpu=True)`` sets them up; accelerate's
FSDP needs an accelerator device, so on CPU it trains with DDP.
"""

from __future__ import annotations

import argparse

import torch
from accelerate import Accelerator, PartialState
from hf_tiny import Tokens, TokenStream, tiny_llama, with_lora


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--lora", action="store_true", help="train LoRA adapters (peft) instead of the whole model")
    parser.add_argument("--stream", action="store_true", help="the data as a stream (an IterableDataset)")
    parser.add_argument("--cuda", action="store_true", help="NCCL on one GPU per rank instead of gloo on CPU")
    args = parser.parse_args()
    if not args.cuda:
        PartialState(cpu=True)  # gloo across CPU processes; Accelerator() then adds the launcher's plugin
    accelerator = Accelerator()
    model = tiny_llama()
    if args.lora:
        model = with_lora(model)
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-3)
    loader = torch.utils.data.DataLoader(TokenStream() if args.stream else Tokens(), batch_size=4)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    model.train()
    for step, batch in zip(range(args.steps), loader, strict=False):
        if step == 0:
            print(f"rank {accelerator.process_index} reads tokens summing to {int(batch['input_ids'].sum())} first",
                  flush=True)
        loss = model(**batch).loss
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
    print(f"rank {accelerator.process_index} ends at loss {loss.item():.4f}", flush=True)
    accelerator.print(f"trained as {accelerator.distributed_type} ({type(model).__name__}), "
                      f"{accelerator.num_processes} processes")
    accelerator.end_training()


if __name__ == "__main__":
    main()
