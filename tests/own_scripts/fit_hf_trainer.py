"""A user's own Hugging Face ``Trainer`` script that takes ``TrainingArguments`` from its command line
(``HfArgumentParser``, as the transformers examples do): what ``shardtop fit`` searches.

    torchrun --nproc_per_node 2 tests/own_scripts/fit_hf_trainer.py --output_dir /tmp/out --use_cpu \\
        --per_device_train_batch_size 8 --max_steps 2 [--gradient_checkpointing] [--deepspeed ds.json]

A small Llama built from its config (nothing is downloaded) on random tokens.  Its vocabulary and
sequence make the logits, and so each sample, large beside the model: under a memory cap one more sample
can be what runs out.  ``--vocab``, ``--seq``, ``--hidden``, ``--layers`` and ``--heads`` size it: on a
GPU, ``--vocab 32000 --hidden 2048 --layers 16 --heads 16 --seq 2048`` is a Llama of about 1 B parameters
(``gpu/record.sh fit`` fits it under ``--fsdp``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers import AutoModelForCausalLM, HfArgumentParser, LlamaConfig, Trainer, TrainingArguments


@dataclass
class ModelArguments:
    vocab: int = 2048
    seq: int = 64
    hidden: int = 64
    layers: int = 2
    heads: int = 4
    samples: int = 4096


class Tokens(torch.utils.data.Dataset):  # type: ignore[type-arg]
    """Random token sequences, their own labels (next-token loss)."""

    def __init__(self, count: int, vocab: int, seq: int) -> None:
        self.ids = torch.randint(0, vocab, (count, seq), generator=torch.Generator().manual_seed(0))

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


def main() -> None:
    model_args, training = HfArgumentParser((ModelArguments, TrainingArguments)).parse_args_into_dataclasses()
    config = LlamaConfig(
        vocab_size=model_args.vocab, hidden_size=model_args.hidden, intermediate_size=4 * model_args.hidden,
        num_hidden_layers=model_args.layers, num_attention_heads=model_args.heads,
        num_key_value_heads=model_args.heads,
        max_position_embeddings=model_args.seq, tie_word_embeddings=False,
    )
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config)
    data = Tokens(model_args.samples, model_args.vocab, model_args.seq)
    Trainer(model=model, args=training, train_dataset=data).train()


if __name__ == "__main__":
    main()
