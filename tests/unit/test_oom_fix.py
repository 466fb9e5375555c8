"""The fix an OOM finding offers follows what filled the memory; a logits story only where the failing request
copies logits the failing code holds."""

from __future__ import annotations

from shardtop.diagnose.facts import KindsEvidence, OomEvidence
from shardtop.diagnose.oom_fix import OutOfMemory, oom_fix
from shardtop.rundir.events import StackTensor

MIB = 1 << 20
LOGITS = [4096, 32000]
"""4,096 tokens of a 32,000-token vocabulary: 500 MiB in fp32."""


def _oom(
    asked: int,
    tensors: tuple[StackTensor, ...],
    by_kind: dict[str, int | None],
    other_parts: dict[str, int] | None = None,
) -> OutOfMemory:
    oom = OomEvidence(rank=0, device="cuda:0", phase="forward", step=0, module="head", module_type="Linear",
                      attributed_by="forward-frame", engine_step=None, requested_bytes=asked,
                      allocated=sum(v or 0 for v in by_kind.values()), reserved=None, limit=None, total=None,
                      ranks_out_of_memory=1)
    split = KindsEvidence(allocated=oom.allocated, by_kind=by_kind, unexplained=0, phase="forward", step=0,
                          other_parts=other_parts or {})
    return OutOfMemory(oom=oom, found_by="the probe", engine="ddp", world_size=1, block_type="", others=(),
                       at_oom=split, stack_tensors=tensors)


def _logits(name: str, depth: int | None, dtype: str = "float32") -> StackTensor:
    return StackTensor(name=name, shape=LOGITS, dtype=dtype, nbytes=500 * MIB, where="f (script.py:1)",
                       depth=depth)


def test_a_request_copying_the_logits_the_loss_holds_is_told_as_tokens_times_vocabulary() -> None:
    fix = oom_fix(_oom(500 * MIB, (_logits("input", 0, "bfloat16"),), {"activations": 900 * MIB}))
    assert "fp32 copy of `input`" in fix and "4,096 tokens × 32,000" in fix


def test_new_logits_as_large_as_ones_a_loop_keeps_further_out_are_not_called_a_copy() -> None:
    # An evaluation keeping its outputs: the head asks for this batch's logits, as large as each kept one.
    kept = (_logits("outputs[0]", 4), _logits("outputs[1]", 4))
    fix = oom_fix(_oom(500 * MIB, kept, {"kept": 19_000 * MIB, "params": 900 * MIB}))
    assert "copy of" not in fix
    assert "is tensors kept from earlier steps or forwards" in fix


def test_a_stack_tensor_recorded_without_its_depth_is_not_taken_for_the_copied_one() -> None:
    fix = oom_fix(_oom(500 * MIB, (_logits("logits", None),), {"activations": 900 * MIB}))
    assert "copy of" not in fix


SHARDING_WORDS = ("shard the model", "activation checkpointing on", "ZeRO", "FSDP")


def test_other_filled_by_the_backwards_gradients_is_told_as_such_with_fewer_tokens_not_sharding() -> None:
    parts = {"backward": 1900 * MIB, "forward": 500 * MIB}
    fix = oom_fix(_oom(MIB, (), {"other": 2400 * MIB, "params": 100 * MIB, "script": 900 * MIB}, parts))
    assert "gradients in flight, made by autograd in the backward" in fix and "(2.34 GiB other, 1.86 GiB of it)" in fix
    assert "fewer tokens per micro-batch" in fix and "sharding the model does not" in fix
    assert not any(words in fix for words in SHARDING_WORDS), fix


def test_other_filled_by_the_models_output_is_told_as_its_logits() -> None:
    fix = oom_fix(_oom(MIB, (), {"other": 4000 * MIB, "params": 1000 * MIB}, {"output": 4000 * MIB}))
    assert "the model's output, still held" in fix and "logits_to_keep" in fix
    assert "sharding and activation checkpointing do not" in fix
    assert not any(words in fix for words in SHARDING_WORDS), fix


def test_other_of_no_part_that_fills_half_is_told_by_its_parts() -> None:
    parts = {"backward": 900 * MIB, "buffers": 800 * MIB, "forward": 700 * MIB}
    fix = oom_fix(_oom(MIB, (), {"other": 2400 * MIB, "params": 100 * MIB}, parts))
    assert "no part of them half: 900 MiB gradients in flight in the backward, 800 MiB module buffers, 700 MiB" in fix
    assert "Sharding does not reduce them" in fix and "micro-batch" not in fix
    assert not any(words in fix for words in SHARDING_WORDS), fix
    without = oom_fix(_oom(MIB, (), {"other": 2400 * MIB, "params": 100 * MIB}))  # an older recording's
    assert "which sharding, activation checkpointing and a smaller micro-batch do not reduce" in without


def test_other_filled_by_what_the_loss_made_of_the_logits_is_told_as_the_logits_never_as_sharding() -> None:
    parts = {"loss": 4000 * MIB, "output": 2000 * MIB}
    fix = oom_fix(_oom(MIB, (), {"other": 6000 * MIB, "params": 1000 * MIB}, parts))
    assert "(5.86 GiB other; 1.95 GiB the output, 3.91 GiB the loss's)" in fix
    assert "the model's output and what the loss made of it (an fp32 copy of the logits, their log-softmax)" in fix
    assert "Fewer tokens per micro-batch" in fix and "fused linear-cross-entropy" in fix and "logits_to_keep" in fix
    assert not any(words in fix for words in SHARDING_WORDS), fix
    # Neither half of other alone, the two together: still the logits, not the parts listed.
    parts = {"backward": 900 * MIB, "loss": 800 * MIB, "output": 400 * MIB}
    together = oom_fix(_oom(MIB, (), {"other": 2100 * MIB, "params": 100 * MIB}, parts))
    assert "what the loss made of it" in together and "no part of them half" not in together
    assert not any(words in together for words in SHARDING_WORDS), together
