"""TRL's ``SFTTrainer`` on a tiny Llama built from its config, as a user runs it under ``accelerate launch``.

Nothing is downloaded: the tokenizer is a word-level one built here, the model
is built from a ``LlamaConfig``, the data set is made in memory.  Rank 0 prints
one line: ``final steps=N loss=X distributed_type=T`` (the loss of the last
logged step, and how accelerate trained).  ``--inventory`` prints the model's
parameters (module path -> shapes) and DeepSpeed's default ZeRO-3
persistence threshold as JSON, and trains nothing.
"""

from __future__ import annotations

import argparse
import json
import tempfile

from datasets import Dataset
from tiny_text import sentences, word_level
from transformers import AutoModelForCausalLM, LlamaConfig, PreTrainedTokenizerFast, set_seed
from trl import SFTConfig, SFTTrainer

STEPS = 3
BATCH = 2
SPECIALS = ("<pad>", "<unk>", "<eos>")


def build_tokenizer() -> PreTrainedTokenizerFast:
    return PreTrainedTokenizerFast(tokenizer_object=word_level(SPECIALS), pad_token="<pad>", unk_token="<unk>",
                                   eos_token="<eos>")


def model_config(vocab_size: int) -> LlamaConfig:
    """A two-layer Llama: its MLP matrices (131 072 elements) are partitioned by ZeRO-3, while its attention,
    norms and embeddings stay under DeepSpeed's default persistence threshold (100 000) and are kept whole."""
    return LlamaConfig(
        vocab_size=vocab_size, hidden_size=128, intermediate_size=1024, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64, tie_word_embeddings=False,
    )


def inventory() -> None:
    from deepspeed.runtime.zero.config import DeepSpeedZeroConfig

    model = AutoModelForCausalLM.from_config(model_config(len(build_tokenizer())))
    modules = {name: [list(p.shape) for p in module.parameters(recurse=False)]
               for name, module in model.named_modules()}
    threshold = DeepSpeedZeroConfig().param_persistence_threshold
    print(json.dumps({"modules": modules, "persistence_threshold": threshold}))


def train(steps: int, gradient_checkpointing: bool, cuda: bool) -> None:
    config = SFTConfig(
        output_dir=tempfile.mkdtemp(prefix="trl-sft-"), max_steps=steps, per_device_train_batch_size=BATCH,
        learning_rate=1e-3, logging_steps=1, save_strategy="no", report_to="none", seed=0, data_seed=0,
        max_length=32, dataloader_num_workers=0, disable_tqdm=True, bf16=cuda, use_cpu=not cuda,
        gradient_checkpointing=gradient_checkpointing,
    )
    set_seed(0)
    tokenizer = build_tokenizer()
    # Made after the SFTConfig, as TRL's own scripts do: under ZeRO-3 the model is then built partitioned.
    model = AutoModelForCausalLM.from_config(model_config(len(tokenizer)))
    dataset = Dataset.from_dict({"text": sentences(64)})
    trainer = SFTTrainer(model=model, args=config, train_dataset=dataset, processing_class=tokenizer)
    result = trainer.train()
    losses = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
    if trainer.is_world_process_zero():
        print(f"final steps={result.global_step} loss={losses[-1]!r} "
              f"distributed_type={trainer.accelerator.distributed_type.value}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=STEPS)
    parser.add_argument("--no-gradient-checkpointing", action="store_true", help="TRL turns it on by default")
    parser.add_argument("--inventory", action="store_true", help="print the model's parameters and stop")
    parser.add_argument("--cuda", action="store_true", help="train on the GPUs in bf16, as TRL's configs ask")
    args = parser.parse_args()
    if args.inventory:
        inventory()
    else:
        train(args.steps, not args.no_gradient_checkpointing, args.cuda)


if __name__ == "__main__":
    main()
