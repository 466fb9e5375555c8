"""Activation checkpointing planned as the frameworks apply it, against real training steps on CPU.

A checkpointed region keeps only its inputs through the forward; the backward recomputes it when it gets
there and holds all it saves while it makes its gradients.  A CPU ``shardtop run`` samples its heap once a
step, not at the backward's peak, so the real steps run here, in this process, with every live tensor
storage counted (``tests/support/live_bytes.py``), as ``test_plan.py`` sets an unseen model against its plan.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import msgspec
import pytest
import torch
from torch import nn
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
    CheckpointImpl,
    apply_activation_checkpointing,
    checkpoint_wrapper,
)
from transformers import AutoModelForCausalLM, LlamaConfig, PreTrainedModel

from shardtop.inject.plan_trace import describe_call
from shardtop.plan.compare import make_plan
from shardtop.plan.description import ModelDescription
from shardtop.plan.memory import per_rank
from shardtop.plan.strategies import ADAMW, Strategy
from shardtop.units import format_bytes
from tests.support.live_bytes import LiveBytes

BATCH, LENGTH, VOCAB, HIDDEN, LAYERS = 4, 128, 256, 64, 4
"""A Llama whose decoder layers, not its vocabulary head, make its activations."""


def llama(checkpointing: str) -> PreTrainedModel:
    """Without a key-value cache, as transformers' own gradient checkpointing turns it off: under a
    ``checkpoint_wrapper`` a cache would keep every layer's keys and values (and the recompute appends to
    it), which the plan does not count."""
    config = LlamaConfig(
        vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=4 * HIDDEN, num_hidden_layers=LAYERS,
        num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=LENGTH, tie_word_embeddings=False,
        use_cache=False,
    )
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config)
    if checkpointing == "transformers":
        model.gradient_checkpointing_enable()  # torch.utils.checkpoint, non-reentrant
    elif checkpointing == "checkpoint_wrapper, reentrant":
        wrapper = functools.partial(checkpoint_wrapper, checkpoint_impl=CheckpointImpl.REENTRANT)
        apply_activation_checkpointing(model, checkpoint_wrapper_fn=wrapper,
                                       check_fn=lambda m: type(m).__name__ == "LlamaDecoderLayer")
    model.train()
    return model


def traced(model: nn.Module, tokens: torch.Tensor) -> ModelDescription:
    """As ``shardtop plan -- CMD`` traces the model an engine got, at the batch the script passed."""
    desc, _ = describe_call(model, model, (), {"input_ids": tokens, "labels": tokens})
    assert isinstance(desc, ModelDescription)
    return desc


def measured_peak(build: Callable[[], nn.Module], tokens: torch.Tensor) -> int:
    """Two AdamW steps on CPU tensors, every live storage counted."""
    live = LiveBytes()
    with live:
        model = build()
        opt = torch.optim.AdamW(model.parameters())
        for _ in range(2):
            model(input_ids=tokens, labels=tokens).loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
    return live.peak


@pytest.mark.parametrize("checkpointing", ["transformers", "checkpoint_wrapper, reentrant"])
def test_a_checkpointed_llama_is_planned_within_ten_percent_of_a_real_step(checkpointing: str) -> None:
    tokens = torch.randint(0, VOCAB, (BATCH, LENGTH), generator=torch.Generator().manual_seed(0))
    peak = measured_peak(lambda: llama(checkpointing), tokens)
    desc = traced(llama(checkpointing), tokens)
    single = Strategy(engine="single", optimizer=ADAMW)
    planned = per_rank(desc, single, 1, gpu=False)
    assert desc.checkpointed == LAYERS
    assert abs(planned.peak - peak) <= 0.10 * peak, (planned.peak, peak)
    assert planned.peak_phase == "backward" and planned.recomputed > 0
    without_recompute = per_rank(msgspec.structs.replace(desc, checkpointed=0), single, 1, gpu=False)
    assert without_recompute.peak < 0.90 * peak, (without_recompute.peak, peak)
    notes = make_plan(desc, single, devices=1, gpu=None, accelerator="cpu").notes
    said = f"activation checkpointing: {LAYERS} checkpointed regions (torch.utils.checkpoint) saved as inputs only; " \
           f"the largest recomputed in the backward: {format_bytes(planned.recomputed)}"
    assert any(note.startswith(said) for note in notes), notes


def test_a_checkpointed_layer_recomputes_what_it_saves_unchecked_but_its_input() -> None:
    """The region traced under checkpointing against the same layer traced without: its saved activations
    less the input the checkpoint keeps (the hidden states, batch x length x hidden)."""
    tokens = torch.zeros(BATCH, LENGTH, dtype=torch.long)
    plain, checkpointed = traced(llama("none"), tokens), traced(llama("transformers"), tokens)
    layer = plain.row_of("model.layers.0")
    assert layer is not None and plain.checkpointed == 0
    kept_input = BATCH * LENGTH * HIDDEN
    assert checkpointed.recomputed_float == plain.subtree(plain.saved_float_upto, layer) - kept_input
    assert checkpointed.subtree(checkpointed.saved_float_upto, layer) == kept_input
    assert checkpointed.recomputed_output == BATCH * LENGTH * 4 * HIDDEN  # the MLP's up projection
