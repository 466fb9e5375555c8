"""What torchtitan's llama3 debug model trains on, made here, and its parameters as its config builds them.

torchtitan's debug config reads a tokenizer and a small C4 sample from its own
source tree, which its wheel does not ship.  ``prepare DIR`` writes both:
``DIR/tokenizer`` (``tokenizer.json`` and ``tokenizer_config.json``, for
``--hf-assets-path``) and ``DIR/data`` (JSON lines with a ``text`` field, for
``--dataloader.dataset-path``).  ``inventory`` builds the debug model from
torchtitan's own config on the meta device and prints its parameters (module
path -> shapes) as JSON.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from tiny_text import sentences, word_level

BOS, EOS = "<|begin_of_text|>", "<|end_of_text|>"


def prepare(directory: Path) -> None:
    tokenizer_dir, data_dir = directory / "tokenizer", directory / "data"
    tokenizer_dir.mkdir(parents=True, exist_ok=True)
    data_dir.mkdir(parents=True, exist_ok=True)
    word_level((BOS, EOS)).save(str(tokenizer_dir / "tokenizer.json"))
    (tokenizer_dir / "tokenizer_config.json").write_text(json.dumps({"bos_token": BOS, "eos_token": EOS}))
    lines = (json.dumps({"text": text}) for text in sentences(200, shortest=5, spread=23))
    (data_dir / "train.jsonl").write_text("\n".join(lines) + "\n")


def inventory() -> None:
    import torch
    from torchtitan.models.llama3 import model_registry

    with torch.device("meta"):
        model = model_registry("debugmodel").model.build()
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
