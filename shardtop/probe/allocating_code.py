"""Who allocated a block of the CUDA allocator's trace: the kind its allocating code names, and where.

A trace entry's frames (innermost first) are the Python stack that asked for
the block.  ``kind_of_frames`` reads them against ``FRAME_RULES`` (an
optimizer's state initialisation, an engine's gather, bucket or gradient
code, a module's construction or move, a forward); ``site_of`` names the
place; ``backward_made`` tells what the backward itself made, ``loss_made``
what a loss function made, and ``script_made`` what the training script's own code made.  Nothing here imports torch.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

MARKER_FUNCTION = "_shardtop_trace_marker"
"""The probe's marker allocation is made from a function of this name."""

Frame = Mapping[str, Any]


@dataclass(frozen=True)
class FrameRule:
    """Frames in a file whose path contains ``path`` (and, if given, named one of ``names``) mean ``kind``.

    ``grad_names``: within that file, a function whose name contains "grad" means gradients instead.
    """

    path: str
    kind: str
    names: frozenset[str] | None = None
    grad_names: bool = False

    def matches(self, filename: str, name: str) -> str | None:
        if self.path not in filename or (self.names is not None and name not in self.names):
            return None
        if self.grad_names and "grad" in name.lower():
            return "grads"
        return self.kind


FRAME_RULES: tuple[FrameRule, ...] = (
    FrameRule("torch/optim/", "optimizer", frozenset({"_init_group", "_init_state", "_lazy_init_state"})),
    FrameRule("torch/optim/", "other"),  # the step's temporaries (foreach intermediates)
    FrameRule("torch/distributed/fsdp/_flat_param.py", "params", grad_names=True),
    FrameRule("torch/distributed/fsdp/_fully_shard/_fsdp_param.py", "params", grad_names=True),
    FrameRule("torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py", "params",
              frozenset({"foreach_all_gather_copy_out", "_get_all_gather_input_metadatas"})),
    FrameRule("torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py", "comm"),
    FrameRule("torch/distributed/fsdp/_runtime_utils.py", "grads",
              frozenset({"_reduce_grad", "_reduce_grad_no_shard", "_post_backward_hook", "_accumulate_sharded_grad",
                         "_get_reduce_scatter_tensors", "_post_reduce_grad_callback", "_div_if_needed"})),
    FrameRule("torch/distributed/fsdp/_runtime_utils.py", "params", frozenset({"_unshard", "_pre_forward_unshard"})),
    FrameRule("torch/distributed/fsdp/", "params",
              frozenset({"_init_param_handle_from_module", "_move_module_to_device",
                         "_materialize_meta_module", "_init_param_handle_from_params"})),
    FrameRule("torch/nn/parallel/distributed.py", "comm", frozenset({"__init__", "_ddp_init_helper"})),
    FrameRule("deepspeed/runtime/zero/partition_parameters.py", "params"),
    FrameRule("deepspeed/runtime/zero/partitioned_param_coordinator.py", "params"),
    FrameRule("deepspeed/runtime/zero/stage3.py", "optimizer",
              frozenset({"_create_fp32_partitions", "initialize_optimizer_states", "_optimizer_step"})),
    FrameRule("deepspeed/runtime/zero/stage3.py", "params",
              frozenset({"_create_fp16_partitions_with_defragmentation"})),
    FrameRule("deepspeed/runtime/zero/stage3.py", "comm",
              frozenset({"_DeepSpeedZeroOptimizer_Stage3__reduce_and_partition_ipg_grads",
                         "__reduce_and_partition_ipg_grads", "allreduce_bucket", "average_tensor"})),
    FrameRule("deepspeed/runtime/zero/stage3.py", "grads", grad_names=True, names=None),
    FrameRule("deepspeed/runtime/zero/stage_1_and_2.py", "optimizer", frozenset({"initialize_optimizer_states"})),
    FrameRule("deepspeed/runtime/zero/stage_1_and_2.py", "comm",
              frozenset({"average_tensor", "reduce_ipg_grads", "allreduce_bucket", "allreduce_and_copy",
                         "gradient_reduction_w_predivide", "allreduce_no_retain", "buffered_reduce_fallback"})),
    FrameRule("deepspeed/runtime/zero/stage_1_and_2.py", "grads", grad_names=True, names=None),
    FrameRule("deepspeed/runtime/bf16_optimizer.py", "grads", grad_names=True, names=None),
    FrameRule("torch/nn/modules/module.py", "params", frozenset({"_apply", "to", "cuda", "to_empty", "_to_empty",
                                                                 "half", "float", "bfloat16", "type"})),
    FrameRule("torch/nn/init.py", "params"),
    FrameRule("torch/utils/checkpoint.py", "activations"),
)
"""Matched against each frame, innermost first; the first frame any rule matches decides.
A frame in an engine's file that no rule names falls through to the frames outside it."""

_MODULE_INIT = ("__init__", "reset_parameters")


def kind_of_frames(frames: Sequence[Frame], forward: str = "activations") -> str | None:
    """The kind the allocating code says, or None.

    Besides ``FRAME_RULES``: a module's constructor (``__init__`` or
    ``reset_parameters`` of a ``torch/nn/modules`` class) makes parameters,
    and a ``forward`` anywhere else (the user's or torch's modules) makes
    ``forward``: by default activations (a forward's block still alive later
    is a tensor saved for backward, or the output on its way there); "other"
    where the saved tensors were followed, so that whatever a census did not
    see as saved was not.
    """
    for frame in frames:
        filename = str(frame.get("filename", "")).replace("\\", "/")
        name = str(frame.get("name", ""))
        if name == MARKER_FUNCTION:
            return None
        for rule in FRAME_RULES:
            kind = rule.matches(filename, name)
            if kind is not None:
                return kind
        if name in _MODULE_INIT and "torch/nn/modules/" in filename:
            return "params"
        if name == "forward" and not _in_engine(filename):
            return forward
    return None


_ENGINE_PATHS = ("torch/distributed/", "torch/nn/parallel/", "deepspeed/", "lightning/")


def _in_engine(filename: str) -> bool:
    return any(path in filename for path in _ENGINE_PATHS)


def is_marker(frames: Sequence[Frame]) -> bool:
    return any(frame.get("name") == MARKER_FUNCTION for frame in frames[:3])


_IMPORT_ROOTS = tuple(sorted({p.replace("\\", "/").rstrip("/") + "/" for p in sys.path if p and p != "."},
                             key=len, reverse=True))
"""Where this process imports from: a frame's path is shown from below the longest of them."""


def site_of(frames: Sequence[Frame]) -> str:
    """``path:line in function`` of the innermost frame outside torch's own Python (the innermost of all
    when every frame is torch's); ``""`` for none.  A path under ``site-packages`` (or another folder this
    process imports from) is shown from there on, any other by its file name."""
    if not frames:
        return ""
    frame = _innermost_outside_torch(frames) or frames[0]
    path = str(frame.get("filename", "")).replace("\\", "/")
    root = next((r for r in _IMPORT_ROOTS if path.startswith(r)), None)
    if root is not None:
        path = path[len(root):]
    elif "-packages/" in path:
        path = path.rsplit("-packages/", 1)[1]
    else:
        path = path.rsplit("/", 1)[-1]
    return f"{path}:{frame.get('line', '?')} in {frame.get('name', '?')}"


def _innermost_outside_torch(frames: Sequence[Frame]) -> Frame | None:
    """The innermost frame whose file is not torch's own Python, or None."""
    torch_dir = _torch_dir()
    for frame in frames:
        path = str(frame.get("filename", "")).replace("\\", "/")
        if not _torchs(path, torch_dir):
            return frame
    return None


def _torchs(path: str, torch_dir: str | None) -> bool:
    """Whether ``path`` is a file of torch's own package: under the ``torch`` this process imported, or a
    ``torch/`` folder right under ``site-packages``.  Not any path with a ``torch`` folder in it: a
    virtualenv in ``/opt/torch/`` holds Lightning's and the script's files too."""
    if torch_dir is not None and path.startswith(torch_dir):
        return True
    inside = path.rsplit("-packages/", 1)[1] if "-packages/" in path else path
    return inside.startswith("torch/")


def _torch_dir() -> str | None:
    """The folder of the ``torch`` package this process imported, if it did."""
    torch = sys.modules.get("torch")
    file = getattr(torch, "__file__", None)
    return str(file).replace("\\", "/").rsplit("/", 1)[0] + "/" if file else None


_LIBRARY_PATHS = ("-packages/", "/lib/python3", "shardtop/probe/", "shardtop/inject/")
"""Where a file is an installed library's (``site-packages``, ``dist-packages``), the standard library's or
shardtop's own probe, not the training script's."""


def script_made(frames: Sequence[Frame]) -> bool:
    """Made by the training script's own code: the innermost frame outside torch's own Python is in a file
    of none of the installed libraries, the standard library or the probe (``_LIBRARY_PATHS``)."""
    inner = _innermost_outside_torch(frames)
    if inner is None:
        return False
    path = str(inner.get("filename", "")).replace("\\", "/")
    return bool(path) and not path.startswith("<") and not any(p in path for p in _LIBRARY_PATHS)


LOSS_RULES: tuple[FrameRule, ...] = (
    FrameRule("torch/nn/functional.py", "loss", frozenset({
        "cross_entropy", "nll_loss", "binary_cross_entropy", "binary_cross_entropy_with_logits", "kl_div",
        "poisson_nll_loss", "gaussian_nll_loss", "mse_loss", "l1_loss", "smooth_l1_loss", "huber_loss",
        "multilabel_soft_margin_loss", "multi_margin_loss",
    })),
    FrameRule("torch/nn/modules/loss.py", "loss"),
    FrameRule("transformers/loss/", "loss"),
)
"""A frame in one of these is a loss function's: ``torch.nn.functional``'s losses, ``torch.nn``'s loss
modules, transformers' (``ForCausalLMLoss``, ``fixed_cross_entropy``)."""
SOFTMAX = FrameRule("torch/nn/functional.py", "loss", frozenset({"log_softmax", "softmax"}))
"""A softmax is a loss's only where no module's ``forward`` called it (an attention's is its module's)."""


def loss_made(frames: Sequence[Frame]) -> bool:
    """Allocated by a loss function's code (``LOSS_RULES``; a softmax the script called itself), innermost
    first: a module's ``forward`` reached before any loss frame made it, not a loss (an attention's softmax)."""
    softmax = False
    for frame in frames:
        filename = str(frame.get("filename", "")).replace("\\", "/")
        name = str(frame.get("name", ""))
        if name == MARKER_FUNCTION:
            return False
        if any(rule.matches(filename, name) for rule in LOSS_RULES):
            return True
        if SOFTMAX.matches(filename, name):
            softmax = True
        elif name == "forward" and not _in_engine(filename):
            return False
    return softmax


def backward_made(frames: Sequence[Frame]) -> bool:
    """Made by the backward itself: autograd's engine on its own thread (no Python frame), or the Python
    ``backward`` of an autograd Function outside torch (DeepSpeed ZeRO-3's linear, a user's own)."""
    if not frames:
        return True
    inner = _innermost_outside_torch(frames)
    return inner is not None and inner.get("name") == "backward"
