"""QLoRA as its users train it: a 4-bit (nf4) Llama from ``BitsAndBytesConfig``, LoRA adapters, AdamW.

A tiny Llama (2 layers, hidden 64) is saved, then loaded the way QLoRA users
load theirs (``from_pretrained(..., quantization_config=BitsAndBytesConfig(
load_in_4bit=True, bnb_4bit_quant_type="nf4"))``, computing in fp32 on CPU),
prepared with peft's ``prepare_model_for_kbit_training`` (gradient
checkpointing on) and given LoRA adapters (``r=8``).  bitsandbytes' matmul
(an ``autograd.Function``) keeps the 4-bit ``Params4bit`` weight and its
``quant_state`` on its context and dequantizes the weight with them again in
backward.  Four AdamW steps on fixed token batches.  ``--double-quant``: the
weights' scales are quantized too (``bnb_4bit_use_double_quant``), each
``quant_state`` then holding a state of its own for them.

Run alone (one process) or under ``torchrun --nproc_per_node 2`` (DDP over
gloo; every rank loads the checkpoint rank 0 saved).  ``--fsdp2`` (under
torchrun): FSDP2 instead of DDP, as QLoRA-FSDP users shard: the 4-bit weights
packed in fp32 (``bnb_4bit_quant_storage``, so that they shard like the other
parameters), ``fully_shard`` on each decoder layer and on the root, over a CPU
mesh of all ranks; bitsandbytes' ``Linear4bit`` keeps each weight's
``quant_state`` on the module and hands it back to the weight FSDP2 gathers.
``--zero3`` (under torchrun, ``DS_ACCELERATOR=cpu``): DeepSpeed ZeRO-3 as
Hugging Face documents it for QLoRA: the 4-bit weights packed in fp32, the
dtype of the rest of the model, so that ZeRO-3 partitions them like any other
parameter; ZeRO-3 enabled (an ``HfDeepSpeedConfig`` kept alive) before the
model is loaded, and the model and an AdamW on its adapters handed to
``deepspeed.initialize``.  transformers loads a quantized model whole even
then (it builds it on the meta device, never under ``zero.Init``) and
refuses a ``device_map``; ``deepspeed.initialize`` partitions it.  The
config is the Trainer's with its ``"auto"`` values resolved for this model
(a persistence threshold of ten times the hidden size).  Rank 0 prints the bytes
the parameters hold (``params bytes=N``; the 4-bit weights' alone, ``4bit
bytes=N``; the adapters', ``trainable bytes=N``), the bytes of the tensors the
4-bit weights' ``quant_state`` holds (``quant_state bytes=N``), the model's
parameters as its config makes them plus the adapters (``logical params=N``),
the elements the 4-bit weights stand for (``4bit params=N``) and ``final
steps=N loss=X``; also the bytes of the parameters ZeRO-3 keeps whole, under
this script's config with ``--zero3``, else under DeepSpeed's own threshold
(``persistent bytes=N``, the 4-bit weights among them ``persistent 4bit
bytes=N``), and under ZeRO-3 each rank what it holds after training, read
from DeepSpeed's own attributes (``rank R zero3 bytes=N``).
"""

from __future__ import annotations

import os
import sys
import tempfile
from collections.abc import Iterable

import torch
import torch.distributed as dist
from peft import LoraConfig, get_peft_model, prepare_model_for_kbit_training
from transformers import BitsAndBytesConfig, LlamaConfig, LlamaForCausalLM
from transformers.integrations import HfDeepSpeedConfig, is_deepspeed_zero3_enabled

VOCAB = 128
TOKENS = 32
BATCH = 2
STEPS = 4
PERSISTENCE_PER_HIDDEN = 10
"""The Trainer's ``"auto"`` ``stage3_param_persistence_threshold``: ten times the hidden size."""
DEEPSPEED_PERSISTENCE_THRESHOLD = 100_000
"""DeepSpeed's own ``stage3_param_persistence_threshold``, where a config does not set one."""


CONFIG = LlamaConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                     num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=TOKENS)


def saved_llama(directory: str) -> None:
    torch.manual_seed(0)
    LlamaForCausalLM(CONFIG).save_pretrained(directory)


def qlora(directory: str, double_quant: bool, storage: torch.dtype = torch.uint8) -> torch.nn.Module:
    quantization = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4",
                                      bnb_4bit_use_double_quant=double_quant, bnb_4bit_compute_dtype=torch.float32,
                                      bnb_4bit_quant_storage=storage)
    # transformers refuses a ``device_map`` while ZeRO-3 is enabled; bitsandbytes' quantizer then picks the CPU
    placed = {} if is_deepspeed_zero3_enabled() else {"device_map": "cpu"}
    model = LlamaForCausalLM.from_pretrained(directory, quantization_config=quantization, dtype=torch.float32,
                                             **placed)
    model = prepare_model_for_kbit_training(model)
    lora = LoraConfig(r=8, lora_alpha=16, lora_dropout=0.0, task_type="CAUSAL_LM",
                      target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"])
    torch.manual_seed(0)
    adapted: torch.nn.Module = get_peft_model(model, lora)
    return adapted


def batch(step: int, rank: int) -> torch.Tensor:
    return torch.randint(0, VOCAB, (BATCH, TOKENS), generator=torch.Generator().manual_seed(1000 * step + rank))


def stored(parameters: Iterable[torch.nn.Parameter]) -> int:
    """Bytes as the parameters hold them: a 4-bit weight is two to a byte, its ``quant_state`` apart."""
    return sum(p.numel() * p.element_size() for p in parameters)


def unquantised_params() -> int:
    """Elements of the Llama the config makes, before any weight is quantised (built on the meta device)."""
    with torch.device("meta"):
        return sum(p.numel() for p in LlamaForCausalLM(CONFIG).parameters())


def quant_state_tensors(state: object) -> list[torch.Tensor]:
    """Every tensor a ``QuantState`` holds, its nested state's (``state2``) included."""
    found: list[torch.Tensor] = []
    for value in vars(state).values():
        if isinstance(value, torch.Tensor):
            found.append(value)
        elif type(value).__name__ == "QuantState":
            found.extend(quant_state_tensors(value))
    return found


def quant_state_bytes(parameters: Iterable[torch.nn.Parameter]) -> int:
    """Bytes of the storages the 4-bit weights' ``quant_state`` tensors hold, each storage once."""
    storages = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes()
                for p in parameters if type(p).__name__ == "Params4bit" for t in quant_state_tensors(p.quant_state)}
    return sum(storages.values())


def stood_for(parameters: Iterable[torch.nn.Parameter]) -> int:
    """Elements the 4-bit weights stand for: the shapes their ``quant_state`` keeps (they store two to a byte)."""
    return sum(p.quant_state.shape.numel() for p in parameters if type(p).__name__ == "Params4bit")


def zero3_config() -> dict[str, object]:
    """ZeRO-3 as the Hugging Face Trainer resolves its ``"auto"`` values for this model (fp32, no offload)."""
    hidden = CONFIG.hidden_size
    return {"train_micro_batch_size_per_gpu": BATCH, "gradient_accumulation_steps": 1,
            "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": PERSISTENCE_PER_HIDDEN * hidden,
                                  "reduce_bucket_size": hidden * hidden,
                                  "stage3_prefetch_bucket_size": int(0.9 * hidden * hidden)},
            "zero_allow_untested_optimizer": True, "steps_per_print": 10**9}


def kept_whole_by_zero3(parameters: Iterable[torch.nn.Parameter], threshold: int) -> list[torch.nn.Parameter]:
    """The parameters ZeRO-3 keeps whole on every rank: those of at most ``threshold`` elements
    (``stage3_param_persistence_threshold``) as stored (a 4-bit weight packed in fp32: eight elements to one)."""
    return [p for p in parameters if p.numel() <= threshold]


def zero3_held_bytes(model: torch.nn.Module) -> int:
    """Bytes of the parameters this rank holds under ZeRO-3, read from DeepSpeed's own attributes: its share of
    every parameter (padding left out), and the parameters DeepSpeed keeps whole (``ds_persist``) whole too."""
    rank = dist.get_rank()
    held = 0
    for param in model.parameters():
        part = param.ds_tensor  # type: ignore[attr-defined]
        numel, size = int(param.ds_numel), part.element_size()  # type: ignore[attr-defined]
        chunk = int(part.ds_numel)
        held += max(0, min(chunk, numel - rank * chunk)) * size
        if getattr(param, "ds_persist", False):
            held += numel * size
    return held


def fully_sharded(model: torch.nn.Module) -> torch.nn.Module:
    """FSDP2 as QLoRA-FSDP users apply it: each decoder layer a unit, the root one more, over all ranks."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    for layer in model.get_base_model().model.layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model


def main() -> None:
    torch.set_num_threads(1)
    distributed = "WORLD_SIZE" in os.environ
    if distributed:
        dist.init_process_group("gloo")
    rank = dist.get_rank() if distributed else 0
    engine = "fsdp2" if distributed and "--fsdp2" in sys.argv[1:] else "zero3" if (
        distributed and "--zero3" in sys.argv[1:]) else "ddp" if distributed else ""
    # ZeRO-3 enabled before the model is loaded, as the Trainer enables it: kept alive while it loads
    zero3 = HfDeepSpeedConfig(zero3_config()) if engine == "zero3" else None
    with tempfile.TemporaryDirectory() as mine:
        # under torchrun, every rank loads the checkpoint rank 0 saved, as from a shared disk
        directory = [mine]
        if distributed:
            dist.broadcast_object_list(directory)
        if rank == 0:
            saved_llama(directory[0])
        if distributed:
            dist.barrier()
        model = qlora(directory[0], "--double-quant" in sys.argv[1:],
                      torch.float32 if engine in ("fsdp2", "zero3") else torch.uint8)
        if distributed:
            dist.barrier()
    model.train()
    if rank == 0:
        print(f"params bytes={stored(model.parameters())}", flush=True)
        print(f"4bit bytes={stored(p for p in model.parameters() if type(p).__name__ == 'Params4bit')}", flush=True)
        print(f"trainable bytes={stored(p for p in model.parameters() if p.requires_grad)}", flush=True)
        print(f"quant_state bytes={quant_state_bytes(model.parameters())}", flush=True)
        adapters = sum(p.numel() for p in model.parameters() if p.requires_grad)
        print(f"logical params={unquantised_params() + adapters}", flush=True)
        print(f"4bit params={stood_for(model.parameters())}", flush=True)
        # what ZeRO-3 would keep whole: under this script's config, else under DeepSpeed's own threshold
        threshold = PERSISTENCE_PER_HIDDEN * CONFIG.hidden_size if engine == "zero3" else (
            DEEPSPEED_PERSISTENCE_THRESHOLD)
        kept = kept_whole_by_zero3(model.parameters(), threshold)
        print(f"persistent bytes={stored(kept)}", flush=True)
        print(f"persistent 4bit bytes={stored(p for p in kept if type(p).__name__ == 'Params4bit')}", flush=True)
    loss = train_zero3(model, rank) if engine == "zero3" else train(model, distributed, rank, engine == "fsdp2")
    del zero3
    if rank == 0:
        print(f"final steps={STEPS} loss={loss!r}", flush=True)
    if distributed:
        dist.barrier()
        dist.destroy_process_group()


def train(model: torch.nn.Module, distributed: bool, rank: int, fsdp2: bool = False) -> float:
    """AdamW steps on the adapters, under DDP when distributed (FSDP2 with ``fsdp2``); the DDP wrapper is gone
    when this returns.

    It goes while the process group is still registered: had the wrapper's reducer held the group's last
    reference, dropping it would join gloo's worker threads with the GIL held while one of them waits for
    the GIL to drop its last allreduce (which keeps gradient checkpointing's hooks), and the rank would
    hang after training, with or without shardtop (torch 2.13, about 1 run in 10 on 2 cores).
    """
    trained = fully_sharded(model) if fsdp2 else torch.nn.parallel.DistributedDataParallel(model) if (
        distributed) else model
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    loss = torch.zeros(())
    for step in range(STEPS):
        tokens = batch(step, rank)
        loss = trained(input_ids=tokens, labels=tokens).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    return float(loss)


def train_zero3(model: torch.nn.Module, rank: int) -> float:
    """AdamW steps on the adapters under ``deepspeed.initialize`` with ZeRO-3, which partitions every parameter
    (the 4-bit weights' fp32 packing too) over the ranks; each rank then prints what it holds
    (``rank R zero3 bytes=N``)."""
    import deepspeed

    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    engine, *_ = deepspeed.initialize(model=model, optimizer=optimizer, config=zero3_config())
    loss = torch.zeros(())
    for step in range(STEPS):
        tokens = batch(step, rank)
        loss = engine(input_ids=tokens, labels=tokens).loss
        engine.backward(loss)
        engine.step()
    print(f"rank {rank} zero3 bytes={zero3_held_bytes(model)}", flush=True)
    return float(loss)


if __name__ == "__main__":
    main()
