"""A tiny Llama 3.2 checkpoint in Hugging Face's format, its tokenizer and an Alpaca data set, made here.

torchtune's ``llama3_2/1B_full`` config reads a downloaded Llama 3.2 1B: this
writes what it reads, small.  ``prepare DIR`` writes

- ``DIR/model``: ``config.json`` and ``model.safetensors`` (seeded random
  weights of ``torchtune.models.llama3_2.llama3_2(**TINY_LLAMA)``, converted to
  Hugging Face's names with torchtune's own ``tune_to_hf``), for
  ``FullModelHFCheckpointer``;
- ``DIR/tokenizer.model``: a tiktoken file of the 256 single bytes, and
  ``DIR/tokenizer.json``: Llama 3's special tokens numbered after them
  (``llama3_tokenizer``'s ``special_tokens_path``), so the vocabulary is
  ``VOCAB`` and not 128 256;
- ``DIR/alpaca.json``: Alpaca rows, for ``alpaca_dataset`` with ``source=json``.

``inventory`` builds the same model on the meta device and prints its
parameters (module path -> shapes) as JSON.  Nothing is downloaded.
"""

from __future__ import annotations

import argparse
import base64
import json
from pathlib import Path
from typing import Any

BYTES = 256
SPECIAL_TOKENS = (
    "<|begin_of_text|>", "<|end_of_text|>", "<|finetune_right_pad_id|>", "<|step_id|>", "<|start_header_id|>",
    "<|end_header_id|>", "<|eom_id|>", "<|eot_id|>", "<|python_tag|>", "<|image|>", "<|video|>",
)
VOCAB = BYTES + len(SPECIAL_TOKENS)
TINY_LLAMA = {"vocab_size": VOCAB, "num_layers": 2, "num_heads": 4, "num_kv_heads": 2, "embed_dim": 64,
              "max_seq_len": 256, "intermediate_dim": 128}
"""``llama3_2``'s arguments: two blocks, grouped-query attention, embeddings tied to the output as in 1B."""


def build() -> Any:
    from torchtune.models.llama3_2 import llama3_2

    return llama3_2(**TINY_LLAMA)


def prepare(directory: Path) -> None:
    import torch
    from safetensors.torch import save_file
    from tiny_text import sentence
    from torchtune.models.convert_weights import tune_to_hf

    model_dir = directory / "model"
    model_dir.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    model = build()
    heads, kv_heads, dim = TINY_LLAMA["num_heads"], TINY_LLAMA["num_kv_heads"], TINY_LLAMA["embed_dim"]
    state = tune_to_hf(model.state_dict(), num_heads=heads, num_kv_heads=kv_heads, dim=dim)
    save_file({name: tensor.contiguous() for name, tensor in state.items()}, str(model_dir / "model.safetensors"))
    (model_dir / "config.json").write_text(json.dumps({
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": VOCAB, "hidden_size": dim,
        "num_attention_heads": heads, "num_key_value_heads": kv_heads, "num_hidden_layers": TINY_LLAMA["num_layers"],
        "intermediate_size": TINY_LLAMA["intermediate_dim"], "tie_word_embeddings": True, "torch_dtype": "float32",
    }))
    ranks = (f"{base64.b64encode(bytes([i])).decode()} {i}" for i in range(BYTES))
    (directory / "tokenizer.model").write_text("\n".join(ranks) + "\n")
    added = [{"id": BYTES + i, "content": token, "special": True} for i, token in enumerate(SPECIAL_TOKENS)]
    (directory / "tokenizer.json").write_text(json.dumps({"added_tokens": added}))
    rows = [{"instruction": sentence(i, 3 + i % 5), "input": "", "output": sentence(i + 11, 2 + i % 7)}
            for i in range(64)]
    (directory / "alpaca.json").write_text(json.dumps(rows))


def inventory() -> None:
    import torch

    with torch.device("meta"):
        model = build()
    modules = {name: [list(p.shape) for p in module.parameters(recurse=False)]
               for name, module in model.named_modules()}
    print(json.dumps({"modules": modules}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("what", choices=("prepare", "inventory"))
    parser.add_argument("directory", nargs="?", type=Path)
    args = parser.parse_args()
    if args.what == "prepare":
        prepare(args.directory)
    else:
        inventory()


if __name__ == "__main__":
    main()
