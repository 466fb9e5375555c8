"""What a forward saves under autocast, traced on the meta device as the plan traces it, against real CPU forwards.

Autocast runs each op in its own dtype (``shardtop/trace/autocast.py``): matmuls and attention in half
precision, LayerNorm and the losses in fp32, every other op in the dtype its inputs promote to.  So what a
forward saves under it is not all 2 bytes an element, as the plan counted mixed precision before: a residual
stream made fp32 (``.float()``, as the presets' segmenter does after its first and last stacks) is saved at
4 bytes by the LayerNorms that take it, on a CPU as on a GPU.  On CUDA, LayerNorm also saves an fp32 copy of
a half input; CPU autocast runs LayerNorm in its input's dtype, so that part stands on CUDA's lists (ATen's
``autocast_mode.h``) and on the GPU recordings (``tests/unit/test_plan_recordings.py``).

Saved tensors are counted as the plan counts them: each storage once, the parameters left out, and (for the
plan's figures) autocast's copies of the parameters too, which the plan counts with the parameters.
"""

from __future__ import annotations

import contextlib
import json
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import torch
from torch import nn

from shardtop.inject.plan_trace import describe_call
from shardtop.runner.models import TransformerBlock
from shardtop.trace.autocast import CUDA_AUTOCAST, Autocast, AutocastPolicy
from shardtop.trace.describe import describe_model, walk
from shardtop.trace.meta import build_on_meta
from shardtop.trace.presets import describe_preset
from shardtop.trace.profile import fused_attention, module_signatures, saved_activations
from shardtop.trace.recipes import RECIPES

DIM, HEADS, BATCH, LENGTH, CLASSES = 64, 4, 2, 16, 8
STREAM = BATCH * LENGTH * DIM
"""Elements of the residual stream."""
CPU_LISTS = AutocastPolicy(
    half=frozenset({"linear", "scaled_dot_product_attention", "_scaled_dot_product_flash_attention_for_cpu"}),
    fp32=frozenset({"cross_entropy", "cross_entropy_loss", "nll_loss"}),
)
"""CPU autocast's lists (``TORCH_LIBRARY_IMPL(aten, AutocastCPU, m)``) for the ops ``Stacks`` runs: unlike
CUDA's, LayerNorm is in neither."""
FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "runs" / "h200-split" / "20261201-045257-ddp-baseline-f54a"


class Stacks(nn.Module):
    """Two of the presets' transformer blocks, the stream made fp32 between them as ``PatchSegmenter`` makes it
    after its first stack."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Linear(DIM, DIM)
        self.first = TransformerBlock(DIM, HEADS)
        self.second = TransformerBlock(DIM, HEADS)
        self.head = nn.Linear(DIM, CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        tokens = self.first(self.embed(x)).float()
        out: torch.Tensor = self.head(self.second(tokens))
        return out


def loss_of(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return nn.functional.cross_entropy(model(x).float().flatten(0, 1), y.flatten())


def batch(device: str) -> tuple[torch.Tensor, torch.Tensor]:
    if device == "meta":
        return (torch.empty(BATCH, LENGTH, DIM, device="meta"),
                torch.empty(BATCH, LENGTH, dtype=torch.long, device="meta"))
    return torch.randn(BATCH, LENGTH, DIM), torch.randint(0, CLASSES, (BATCH, LENGTH))


@contextlib.contextmanager
def saved_storages(model: nn.Module, *, without_parameter_copies: bool) -> Iterator[Counter[tuple[int, torch.dtype]]]:
    """(bytes, dtype) of each storage the forward run inside saves for backward, once, parameters left out
    (and, if asked, the copies autocast made of them: tensors whose graph leads only to a parameter)."""
    parameters = [p.untyped_storage() for p in model.parameters()]  # held: their ids stay theirs
    skip = {id(s) for s in parameters}
    leaves = {id(p) for p in model.parameters()}
    seen: Counter[tuple[int, torch.dtype]] = Counter()
    kept: list[torch.Tensor] = []

    def pack(t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        if id(storage) in skip or (without_parameter_copies and _of_a_parameter(t, leaves)):
            return t
        skip.add(id(storage))
        kept.append(t)
        seen[(storage.nbytes(), t.dtype)] += 1
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        yield seen


def _of_a_parameter(t: torch.Tensor, leaves: set[int]) -> bool:
    """``t`` is a parameter's copy, or a view of one: each step back in its graph has one input, to the
    parameter at last."""
    fn = t.grad_fn
    while fn is not None and type(fn).__name__ != "AccumulateGrad":
        inputs = [f for f, _ in fn.next_functions if f is not None]
        if len(inputs) != 1:
            return False
        fn = inputs[0]
    return fn is not None and id(getattr(fn, "variable", None)) in leaves


def real_cpu_forward(*, without_parameter_copies: bool) -> Counter[tuple[int, torch.dtype]]:
    torch.manual_seed(0)
    model = Stacks()
    x, y = batch("cpu")
    with saved_storages(model, without_parameter_copies=without_parameter_copies) as seen, \
            torch.autocast("cpu", dtype=torch.bfloat16):
        loss_of(model, x, y)
    return seen


def described(policy: AutocastPolicy) -> tuple[int, int]:
    """As the plan traces ``Stacks``: its floating elements saved (the plain trace) and its bytes saved as
    under ``policy``'s autocast."""
    x, y = batch("meta")
    model = build_on_meta(Stacks)
    modules, names, parents, end = walk(model)
    signatures = module_signatures(modules, parents, names)
    plain = saved_activations(model, modules, end, signatures, lambda m: loss_of(m, x, y))
    cast = saved_activations(model, modules, end, signatures, lambda m: loss_of(m, x, y), autocast=torch.float16,
                             policy=policy)
    return sum(plain.saved_float), sum(cast.saved_float)


def test_casts_made_at_each_torch_function_save_what_cpu_autocast_saves_tensor_for_tensor() -> None:
    x, y = batch("meta")
    model = build_on_meta(Stacks)
    with saved_storages(model, without_parameter_copies=False) as traced, fused_attention(), \
            Autocast(torch.bfloat16, CPU_LISTS):
        loss_of(model, x, y)
    real = real_cpu_forward(without_parameter_copies=False)
    assert traced == real
    assert any(dtype == torch.float32 and size == STREAM * 4 for size, dtype in real), "the fp32 stream is saved"


def test_the_plans_bytes_under_autocast_are_a_real_cpu_forwards_and_above_two_bytes_an_element() -> None:
    real = real_cpu_forward(without_parameter_copies=True)
    elements, autocast_bytes = described(CPU_LISTS)
    assert autocast_bytes == sum(size * n for (size, dtype), n in real.items() if dtype.is_floating_point)
    # the stream made fp32 is saved by the second block's two LayerNorms at 4 bytes an element, not 2
    assert autocast_bytes - 2 * elements >= 2 * STREAM * 2


def test_cudas_lists_save_an_fp32_copy_of_each_half_input_to_layernorm() -> None:
    """The first block's two LayerNorms get the half stream: on CUDA each saves an fp32 copy of it instead of
    the half stream itself; the second block's stream is fp32 already.  A description holds CUDA's figures."""
    _, on_cpu = described(CPU_LISTS)
    _, on_cuda = described(CUDA_AUTOCAST)
    assert on_cuda - on_cpu == 2 * STREAM * (4 - 2)
    x, y = batch("meta")
    desc = describe_model(build_on_meta(Stacks), lambda m: loss_of(m, x, y), name="stacks", batch_size=BATCH,
                          input_bytes=0)
    assert desc.saved_autocast_upto[-1] == on_cuda


def test_the_presets_fp32_forward_saves_on_cpu_what_the_plan_counts() -> None:
    """``ddp-baseline`` at its GPU size, one real fp32 forward: every byte the plan counts, and no other."""
    config = json.loads((FIXTURE / "run.json").read_text())["config"]
    desc = describe_preset(config)
    torch.manual_seed(0)
    model = RECIPES[config["program"]].build(config)
    image = config["model"]["image"]
    x = torch.randn(config["batch_size"], 3, image, image)
    y = torch.randint(0, config["model"]["classes"], (config["batch_size"], image, image))
    with saved_storages(model, without_parameter_copies=False) as real:
        nn.functional.cross_entropy(model(x).float(), y)
    assert sum(size * n for (size, _), n in real.items()) == desc.saved_float_upto[-1] * 4 + desc.saved_other_upto[-1]


def test_a_commands_forward_run_under_autocast_is_traced_with_its_casts() -> None:
    """``shardtop plan -- CMD`` at the model's first call: traced with autocast's casts where the script's
    forward runs under autocast, and said in the plan's notes; once only where it does not."""
    torch.manual_seed(0)
    model = Stacks()
    x, _ = batch("cpu")
    with torch.autocast("cpu", dtype=torch.bfloat16):
        desc, notes = describe_call(model, model, (x,), {})
    assert desc.saved_autocast_upto and desc.saved_autocast_upto[-1] > 2 * desc.saved_float_upto[-1]
    assert any("ran under autocast" in note for note in notes)
    desc, notes = describe_call(model, model, (x,), {})
    assert not desc.saved_autocast_upto and not any("autocast" in note for note in notes)
