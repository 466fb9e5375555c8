"""The tiny Llama and the synthetic tokens that ``hf_trainer.py`` and ``accelerate_train.py`` train.

Built from a config (nothing is downloaded).  Neither a weight's rows
(vocabulary 250, hidden 30, MLP 74) nor its elements divide evenly by 8: the
last rank of an 8-rank job holds a smaller shard than the others, under FSDP
(rows) and under ZeRO-3 (elements) alike.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import torch
from transformers import AutoModelForCausalLM, LlamaConfig, PreTrainedModel

GPU_SIZE = os.environ.get("HF_TINY_SIZE") == "gpu"
"""``HF_TINY_SIZE=gpu``: a Llama of 167 M parameters (hidden 1024, 8 layers, vocabulary 32 000) on
sequences of 512 tokens, for GPU runs whose memory is the model's rather than the libraries'."""
VOCAB = 32000 if GPU_SIZE else 250
SEQ = 512 if GPU_SIZE else 16


class Tokens(torch.utils.data.Dataset):  # type: ignore[type-arg]
    """Random token sequences, their own labels (next-token loss): enough for three batches of 4 on each of 8
    ranks."""

    def __init__(self, count: int = 128) -> None:
        generator = torch.Generator().manual_seed(0)
        self.ids = torch.randint(0, VOCAB, (count, SEQ), generator=generator)

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


class TokenStream(torch.utils.data.IterableDataset):  # type: ignore[type-arg]
    """The same sequences as a stream (as ``datasets`` streams them): accelerate then reads the batches
    on rank 0 and sends each rank its part."""

    def __init__(self, count: int = 128) -> None:
        self.tokens = Tokens(count)

    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]:
        return (self.tokens[i] for i in range(len(self.tokens)))


def tiny_llama() -> PreTrainedModel:
    """As ``from_pretrained`` builds a model, without the download: under ZeRO-3 (a Trainer's
    ``TrainingArguments(deepspeed=...)``, or accelerate's ``zero3_init_flag``) it is partitioned as it is built."""
    hidden, mlp, layers, heads = (1024, 2816, 8, 16) if GPU_SIZE else (30, 74, 2, 3)
    config = LlamaConfig(
        vocab_size=VOCAB, hidden_size=hidden, intermediate_size=mlp, num_hidden_layers=layers,
        num_attention_heads=heads, num_key_value_heads=heads, max_position_embeddings=SEQ,
        tie_word_embeddings=False,
    )
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(config)


def with_lora(model: PreTrainedModel) -> torch.nn.Module:
    """LoRA adapters (peft) on the attention's query and value projections; the rest frozen."""
    from peft import LoraConfig, get_peft_model

    return get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]))
