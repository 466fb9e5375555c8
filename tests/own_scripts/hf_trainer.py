"""A user's own Hugging Face ``Trainer`` script: nothing of shardtop in it.

A tiny Llama built from its config (``hf_tiny.py``), synthetic tokens, three
steps.  On CPU (gloo; ``DS_ACCELERATOR=cpu`` for DeepSpeed) unless ``--cuda``:

    python tests/own_scripts/hf_trainer.py
    torchrun --nproc_per_node 2 tests/own_scripts/hf_trainer.py --deepspeed tests/own_scripts/ds_zero3.json --lora
    torchrun --nproc_per_node 2 tests/own_scripts/hf_trainer.py --fsdp "full_shard auto_wrap" --cuda

On CPU, accelerate (which the Trainer runs on) trains with DDP whatever
``--fsdp`` asks: its FSDP needs an accelerator device.
"""

from __future__ import annotations

import argparse
import tempfile

from hf_tiny import Tokens, TokenStream, tiny_llama, with_lora
from transformers import Trainer, TrainingArguments


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--local_rank", type=int, default=-1)  # the deepspeed launcher passes it
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--deepspeed", default=None, help="a DeepSpeed config file (ZeRO-3: ds_zero3.json)")
    parser.add_argument("--fsdp", default="", help='FSDP options, e.g. "full_shard auto_wrap"')
    parser.add_argument("--lora", action="store_true", help="train LoRA adapters (peft) instead of the whole model")
    parser.add_argument("--stream", action="store_true", help="the data as a stream (an IterableDataset)")
    parser.add_argument("--cuda", action="store_true", help="NCCL on one GPU per rank instead of gloo on CPU")
    args = parser.parse_args()
    training = TrainingArguments(
        output_dir=tempfile.mkdtemp(prefix="hf-trainer-"),
        per_device_train_batch_size=4,
        max_steps=args.steps,
        learning_rate=1e-3,
        logging_steps=1,
        save_strategy="no",
        report_to=[],
        disable_tqdm=True,
        dataloader_num_workers=0,
        use_cpu=not args.cuda,
        deepspeed=args.deepspeed,
        fsdp=args.fsdp,
        fsdp_config={"transformer_layer_cls_to_wrap": ["LlamaDecoderLayer"]} if args.fsdp else None,
    )
    model = tiny_llama()
    data = TokenStream() if args.stream else Tokens()
    trainer = Trainer(model=with_lora(model) if args.lora else model, args=training, train_dataset=data)
    result = trainer.train()
    print(f"trained as {trainer.accelerator.distributed_type} ({type(trainer.model_wrapped).__name__}), "
          f"rank {training.process_index} of {training.world_size}", flush=True)
    print(f"loop seconds {result.metrics['train_runtime']:.4f}", flush=True)


if __name__ == "__main__":
    main()
