"""A litgpt checkpoint of a tiny Llama-like model, made here from ``litgpt.Config``, and its data.

``prepare DIR`` writes ``DIR/checkpoint`` as ``litgpt finetune_full`` reads
one (``model_config.yaml``, ``lit_model.pth`` with seeded random weights,
``tokenizer.json``, ``tokenizer_config.json``) and ``DIR/train.json`` (Alpaca
rows for ``--data JSON``).  ``inventory DIR`` builds the model from the
checkpoint's config on the meta device and prints its parameters (module path
-> shapes) as JSON.  Nothing is downloaded.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from tiny_text import sentence, word_level

BOS, EOS = "<s>", "</s>"


def config() -> object:
    from litgpt import Config

    return Config(
        name="tiny-llama", block_size=128, vocab_size=64, padded_vocab_size=64, n_layer=2, n_head=4, n_embd=64,
        n_query_groups=2, rotary_percentage=1.0, parallel_residual=False, bias=False, norm_class_name="RMSNorm",
        mlp_class_name="LLaMAMLP", intermediate_size=256,
    )


def prepare(directory: Path) -> None:
    import torch
    from litgpt.model import GPT
    from litgpt.utils import save_config

    checkpoint = directory / "checkpoint"
    checkpoint.mkdir(parents=True, exist_ok=True)
    save_config(config(), checkpoint)
    torch.manual_seed(0)
    torch.save(GPT(config()).state_dict(), checkpoint / "lit_model.pth")
    word_level((BOS, EOS)).save(str(checkpoint / "tokenizer.json"))
    (checkpoint / "tokenizer_config.json").write_text(json.dumps(
        {"bos_token": BOS, "eos_token": EOS, "add_bos_token": True, "tokenizer_class": "PreTrainedTokenizerFast"}))
    rows = [{"instruction": sentence(i, 3 + i % 5), "input": "", "output": sentence(i + 11, 2 + i % 7)}
            for i in range(48)]
    (directory / "train.json").write_text(json.dumps(rows))


def inventory(directory: Path) -> None:
    import torch
    from litgpt import Config
    from litgpt.model import GPT

    with torch.device("meta"):
        model = GPT(Config.from_file(directory / "checkpoint" / "model_config.yaml"))
    modules = {name: [list(p.shape) for p in module.parameters(recurse=False)]
               for name, module in model.named_modules()}
    print(json.dumps({"modules": modules}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("what", choices=("prepare", "inventory"))
    parser.add_argument("directory", type=Path)
    args = parser.parse_args()
    if args.what == "prepare":
        prepare(args.directory)
    else:
        inventory(args.directory)


if __name__ == "__main__":
    main()
