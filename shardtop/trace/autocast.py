"""A forward under CUDA's autocast, traced on the meta device: the dtype each op runs in.

Autocast casts the inputs of some ops at the dispatcher, op by op: matmuls,
convolutions and attention run in the half dtype; LayerNorm, GroupNorm, RMSNorm,
softmax and log-softmax, the losses and some pointwise functions and
reductions run in fp32; every other op runs in the dtype its inputs promote
to.  So what a forward saves for backward under autocast is not all half
precision: LayerNorm saves an fp32 copy of its input, and an op fed the fp32
residual stream (a ``.float()``, or a sum with an fp32 tensor) saves fp32.
The op lists are ATen's for CUDA (``ATen/autocast_mode.h``:
``AT_FORALL_LOWER_PRECISION_FP``, ``AT_FORALL_FP32``,
``AT_FORALL_FP32_SET_OPT_DTYPE``, ``AT_FORALL_PROMOTE``), with the Python
names torch documents for them (``cross_entropy``, ``softmin``, ``normalize``).

A meta tensor has no autocast dispatch key, so ``torch.autocast`` leaves it
as it is.  ``Autocast`` makes the same casts one level up, at each torch
function the forward calls (a ``TorchFunctionMode``), so that autograd saves
tensors of the dtypes a GPU run saves.  A Python torch function that is in no
list (``F.multi_head_attention_forward``) runs its own body under the mode, so
the listed ops it calls are cast as autocast would cast them.  A cast of a
parameter is handed to ``on_cast``: the plan counts those copies with the
parameters, not as activations.
"""

from __future__ import annotations

import types
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_flatten, tree_map


@dataclass(frozen=True)
class AutocastPolicy:
    """Which ops autocast runs in the half dtype, in fp32, or in the widest of their inputs' dtypes, by name."""

    half: frozenset[str]
    fp32: frozenset[str]
    widest: frozenset[str] = frozenset()


CUDA_AUTOCAST = AutocastPolicy(
    half=frozenset({
        "_convolution", "conv1d", "conv2d", "conv3d", "conv_tbc", "conv_transpose1d", "conv_transpose2d",
        "conv_transpose3d", "convolution", "prelu", "addmm", "addmv", "addr", "matmul", "__matmul__",
        "__rmatmul__", "einsum", "mm", "mv", "linalg_vecdot", "linear", "addbmm", "baddbmm", "bmm",
        "chain_matmul", "linalg_multi_dot", "multi_dot", "_thnn_fused_lstm_cell", "_thnn_fused_gru_cell",
        "lstm_cell", "gru_cell", "rnn_tanh_cell", "rnn_relu_cell", "_scaled_dot_product_flash_attention",
        "scaled_dot_product_attention",
        # what ``profile.fused_attention`` runs on the meta device for scaled_dot_product_attention
        "_scaled_dot_product_flash_attention_for_cpu",
    }),
    fp32=frozenset({
        "acos", "asin", "cosh", "erfinv", "exp", "expm1", "log", "log10", "log2", "log1p", "reciprocal", "rsqrt",
        "sinh", "tan", "pow", "__pow__", "__rpow__", "softplus", "layer_norm", "native_layer_norm", "rms_norm",
        "group_norm", "frobenius_norm", "nuclear_norm", "cosine_similarity", "poisson_nll_loss",
        "cosine_embedding_loss", "nll_loss", "nll_loss2d", "hinge_embedding_loss", "kl_div", "l1_loss",
        "smooth_l1_loss", "huber_loss", "mse_loss", "margin_ranking_loss", "multilabel_margin_loss",
        "soft_margin_loss", "triplet_margin_loss", "multi_margin_loss", "binary_cross_entropy_with_logits",
        "dist", "pdist", "cdist", "renorm", "logsumexp", "upsample_nearest1d", "upsample_nearest2d",
        "upsample_nearest3d", "upsample_linear1d", "upsample_bilinear2d", "upsample_trilinear3d",
        "upsample_bicubic2d", "prod", "softmax", "log_softmax", "softmin", "cumprod", "cumsum",
        "linalg_vector_norm", "linalg_matrix_norm", "sum", "norm", "normalize", "cross_entropy",
        "cross_entropy_loss", "__rdiv__", "__rtruediv__",
    }),
    widest=frozenset({
        "addcdiv", "addcmul", "atan2", "bilinear", "cross", "dot", "vdot", "grid_sampler", "grid_sample",
        "index_put", "tensordot", "scatter_add",
    }),
)
"""ATen's CUDA lists (torch 2.4 to 2.13), by the names both the ATen ops and their Python functions carry."""

_CHECKS = ("has_torch_function", "has_torch_function_unary", "has_torch_function_variadic")
"""The names a Python torch function calls to hand itself to a mode; its body runs with them answering no."""


def _no(*args: object, **kwargs: object) -> bool:
    return False


class Autocast(TorchFunctionMode):
    """While inside, torch functions run as under ``torch.autocast`` to ``dtype``, by ``policy``'s lists.

    ``on_cast(source, copy)``: told of every cast made, so that a trace can leave a parameter's copy out
    of the activations.
    """

    def __init__(self, dtype: torch.dtype = torch.float16, policy: AutocastPolicy = CUDA_AUTOCAST,
                 on_cast: Callable[[torch.Tensor, torch.Tensor], None] | None = None) -> None:
        super().__init__()
        self.dtype = dtype
        self.policy = policy
        self.on_cast = on_cast
        self.running: list[Any] = []
        """The Python torch functions whose bodies run under the mode now: their own calls of themselves
        (``Tensor.unflatten`` calling ``super().unflatten``) go through as they are."""

    def __torch_function__(self, func: Any, types_: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        target = self._target(getattr(func, "__name__", ""), args, kwargs)
        if target is not None:
            args, kwargs = tree_map(lambda t: self._cast(t, target), (args, kwargs))
            return func(*args, **kwargs)
        body = self._body(func)
        if body is None:
            return func(*args, **kwargs)
        self.running.append(func)
        try:
            with self:
                return body(*args, **kwargs)
        finally:
            self.running.pop()

    def _target(self, name: str, args: Any, kwargs: dict[str, Any]) -> torch.dtype | None:
        """The dtype ``name`` runs in under autocast, or None where it casts nothing (an explicit ``dtype=``
        too)."""
        if kwargs.get("dtype") is not None:
            return None
        if name in self.policy.half:
            return self.dtype
        if name in self.policy.fp32:
            return torch.float32
        if name in self.policy.widest:
            floats = [t for t in _tensors((args, kwargs)) if _eligible(t)]
            return torch.float32 if any(t.dtype == torch.float32 for t in floats) else None
        return None

    def _cast(self, t: Any, dtype: torch.dtype) -> Any:
        if not isinstance(t, torch.Tensor) or not _eligible(t) or t.dtype == dtype:
            return t
        copy = t.to(dtype)
        if self.on_cast is not None:
            self.on_cast(t, copy)
        return copy

    def _body(self, func: Any) -> Callable[..., Any] | None:
        """``func``'s own code, asking no mode to take it: a Python torch function not yet running."""
        code = getattr(func, "__code__", None)
        if code is None or func in self.running or not any(name in code.co_names for name in _CHECKS):
            return None
        globals_ = dict(func.__globals__)
        globals_.update({name: _no for name in _CHECKS if name in globals_})
        body = types.FunctionType(code, globals_, func.__name__, func.__defaults__, func.__closure__)
        body.__kwdefaults__ = func.__kwdefaults__
        return body


def _eligible(t: torch.Tensor) -> bool:
    """Autocast casts floating-point tensors other than float64."""
    return t.is_floating_point() and t.dtype != torch.float64


def _tensors(tree: Any) -> list[torch.Tensor]:
    return [t for t in tree_flatten(tree)[0] if isinstance(t, torch.Tensor)]
