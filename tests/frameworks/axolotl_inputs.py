"""A tiny Llama saved as axolotl's ``base_model``, its tokenizer, an Alpaca file, a config and axolotl's ZeRO-3 file.

Axolotl's examples name a model on the Hugging Face hub, a data set there,
and a DeepSpeed file that ``axolotl fetch deepspeed_configs`` downloads: this
writes each of them locally, small.  ``prepare DIR`` writes

- ``DIR/model``: a two-layer ``LlamaForCausalLM`` built from its config
  (seeded random weights) and a word-level tokenizer made here, both with
  ``save_pretrained``;
- ``DIR/alpaca.jsonl``: Alpaca rows;
- ``DIR/deepspeed_configs/zero3.json``: axolotl's own ``zero3.json`` as the
  repository ships it (``ZERO3``);
- ``DIR/config.yml``: a full fine-tune in the shape of axolotl's
  ``examples/llama-3/fft-8b.yaml`` on these inputs, in fp32 on the CPU with
  PyTorch's SDPA attention, ``STEPS`` steps of ``BATCH`` rows on each rank,
  and ``deepspeed: deepspeed_configs/zero3.json``.

``inventory`` builds the same model and prints its parameters (module path ->
shapes) and the ZeRO-3 persistence threshold that ``"auto"`` becomes in
transformers' DeepSpeed integration (ten times the hidden size) as JSON.
Nothing is downloaded.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

STEPS = 3
BATCH = 2
SEQUENCE = 64
SPECIALS = ("<pad>", "<unk>", "<s>", "</s>")
ZERO3 = {
    "zero_optimization": {
        "stage": 3, "overlap_comm": True, "contiguous_gradients": True, "sub_group_size": 0,
        "reduce_bucket_size": "auto", "stage3_prefetch_bucket_size": "auto",
        "stage3_param_persistence_threshold": "auto", "max_live_parameters": 0, "max_reuse_distance": 0,
        "gather_16bit_weights_on_model_save": True,
    },
    "bf16": {"enabled": "auto"},
    "fp16": {"enabled": "auto", "auto_cast": False, "loss_scale": 0, "initial_scale_power": 32,
             "loss_scale_window": 1000, "hysteresis": 2, "min_loss_scale": 1},
    "gradient_accumulation_steps": "auto", "gradient_clipping": "auto", "train_batch_size": "auto",
    "train_micro_batch_size_per_gpu": "auto", "wall_clock_breakdown": False,
}
"""axolotl's ``deepspeed_configs/zero3.json``, key for key."""


def tokenizer() -> Any:
    from tiny_text import word_level
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast(tokenizer_object=word_level(SPECIALS), pad_token="<pad>", unk_token="<unk>",
                                   bos_token="<s>", eos_token="</s>")


def model_config(vocab_size: int) -> Any:
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=vocab_size, hidden_size=128, intermediate_size=512, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=SEQUENCE, tie_word_embeddings=False,
        bos_token_id=2, eos_token_id=3, pad_token_id=0,
    )


def build() -> Any:
    from transformers import LlamaForCausalLM

    return LlamaForCausalLM(model_config(len(tokenizer())))


def config(directory: Path) -> dict[str, Any]:
    return {
        "base_model": str(directory / "model"),
        "datasets": [{"path": str(directory / "alpaca.jsonl"), "ds_type": "json", "type": "alpaca"}],
        "dataset_prepared_path": str(directory / "last_run_prepared"),
        "val_set_size": 0,
        "output_dir": "./outputs/out",
        "sequence_len": SEQUENCE,
        "sample_packing": False,
        "gradient_accumulation_steps": 1,
        "micro_batch_size": BATCH,
        "max_steps": STEPS,
        "num_epochs": 1,
        "optimizer": "adamw_torch",
        "lr_scheduler": "cosine",
        "learning_rate": 1e-3,
        "bf16": False,
        "fp16": False,
        "tf32": False,
        "gradient_checkpointing": True,
        "gradient_checkpointing_kwargs": {"use_reentrant": False},
        "logging_steps": 1,
        "attn_implementation": "sdpa",
        "save_strategy": "no",
        "seed": 0,
        "dataloader_num_workers": 0,
        "deepspeed": "deepspeed_configs/zero3.json",
    }


def prepare(directory: Path) -> None:
    import torch
    import yaml
    from tiny_text import sentence

    model_dir = directory / "model"
    torch.manual_seed(0)
    tok = tokenizer()
    tok.save_pretrained(model_dir)
    build().save_pretrained(model_dir)
    rows = [{"instruction": sentence(i, 3 + i % 5), "input": "", "output": sentence(i + 11, 2 + i % 7)}
            for i in range(64)]
    (directory / "alpaca.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    (directory / "deepspeed_configs").mkdir(exist_ok=True)
    (directory / "deepspeed_configs" / "zero3.json").write_text(json.dumps(ZERO3, indent=2))
    (directory / "config.yml").write_text(yaml.safe_dump(config(directory), sort_keys=False))


def inventory() -> None:
    model = build()
    modules = {name: [list(p.shape) for p in module.parameters(recurse=False)]
               for name, module in model.named_modules()}
    print(json.dumps({"modules": modules, "persistence_threshold": 10 * model.config.hidden_size}))


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
