"""The tiny Llama and the synthetic tokens that ``hf_trainer.py`` and ``accelerate_train.py`` train.

Built from a config (nothing is downloaded).  No sharded dimension divides
evenly by 8 (vocabulary 250, hidden 36, MLP 76): the last rank of an 8-rank
job holds a smaller shard than the others.
"""

from __future__ import annotations

import torch
from transformers import LlamaConfig, LlamaForCausalLM

VOCAB = 250
SEQ = 16


class Tokens(torch.utils.data.Dataset):  # type: ignore[type-arg]
    """Random token sequences, their own labels (next-token loss)."""

    def __init__(self, count: int = 64) -> None:
        generator = torch.Generator().manual_seed(0)
        self.ids = torch.randint(0, VOCAB, (count, SEQ), generator=generator)

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


def tiny_llama() -> LlamaForCausalLM:
    config = LlamaConfig(
        vocab_size=VOCAB, hidden_size=36, intermediate_size=76, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=SEQ,
        tie_word_embeddings=False,
    )
    torch.manual_seed(0)
    return LlamaForCausalLM(config)


def with_lora(model: LlamaForCausalLM) -> torch.nn.Module:
    """LoRA adapters (peft) on the attention's query and value projections; the rest frozen."""
    from peft import LoraConfig, get_peft_model

    return get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]))
