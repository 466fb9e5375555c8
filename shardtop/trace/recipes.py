"""How each preset's program builds its model and runs one batch, on the meta device.

A recipe names the model (built from ``shardtop.runner.models`` on the meta
device), one batch and the loss as the program computes them.  The
``Strategy`` each program runs is ``shardtop.plan.preset_strategies``, by the
same program names.  The programs themselves are not imported: they import
Lightning (four seconds), and a plan must be quick.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch
    from torch import nn


@dataclass(frozen=True)
class Recipe:
    """One preset program: its model, one batch and loss."""

    model_name: Callable[[Mapping[str, Any]], str]
    build: Callable[[Mapping[str, Any]], nn.Module]
    forward_loss: Callable[[Mapping[str, Any]], Callable[[nn.Module], torch.Tensor]]
    batch_bytes: Callable[[Mapping[str, Any]], int]


# -- models ---------------------------------------------------------------------


def _linear_stack(config: Mapping[str, Any]) -> nn.Module:
    from shardtop.runner.models import SequentialLinear

    return SequentialLinear(config["model"]["n_layers"], config["model"]["width"])


def _mlp(config: Mapping[str, Any]) -> nn.Module:
    from shardtop.runner.models import MLP

    return MLP(config["model"]["n_layers"], config["model"]["hidden"])


def _segmenter(config: Mapping[str, Any]) -> nn.Module:
    from shardtop.runner.models import PatchSegmenter

    m = config["model"]
    return PatchSegmenter(dim=m["dim"], depth=m["depth"], stem_depth=m["stem_depth"], heads=m["heads"],
                          patch=m["patch"], channels=m["channels"], classes=m["classes"])


def _regression_loss(features_key: str) -> Callable[[Mapping[str, Any]], Callable[[nn.Module], torch.Tensor]]:
    def make(config: Mapping[str, Any]) -> Callable[[nn.Module], torch.Tensor]:
        import torch
        from torch import nn

        x = torch.empty(config["batch_size"], config["model"][features_key], device="meta")
        return lambda model: nn.functional.mse_loss(model(x), x)

    return make


def _segmentation_loss(config: Mapping[str, Any]) -> Callable[[nn.Module], torch.Tensor]:
    import torch
    from torch import nn

    m, batch = config["model"], config["batch_size"]
    x = torch.empty(batch, 3, m["image"], m["image"], device="meta")
    y = torch.empty(batch, m["image"], m["image"], dtype=torch.long, device="meta")
    return lambda model: nn.functional.cross_entropy(model(x).float(), y)


def _regression_bytes(features_key: str) -> Callable[[Mapping[str, Any]], int]:
    return lambda c: 2 * c["batch_size"] * c["model"][features_key] * 4


def _segmentation_bytes(c: Mapping[str, Any]) -> int:
    image: int = c["model"]["image"]
    batch_size: int = c["batch_size"]
    return batch_size * image * image * (3 * 4 + 8)


def _name(cls: str, *keys: str) -> Callable[[Mapping[str, Any]], str]:
    def name(c: Mapping[str, Any]) -> str:
        sizes = ", ".join(f"{k}={c['model'][k]}" for k in keys)
        return f"{cls}({sizes})"

    return name


SEGMENTER_KEYS = ("dim", "depth", "stem_depth", "heads", "patch", "channels", "classes")


_ZERO3 = Recipe(
    model_name=_name("SequentialLinear", "n_layers", "width"),
    build=_linear_stack,
    forward_loss=_regression_loss("width"),
    batch_bytes=_regression_bytes("width"),
)
_SEGMENTATION = Recipe(
    model_name=_name("PatchSegmenter", *SEGMENTER_KEYS),
    build=_segmenter,
    forward_loss=_segmentation_loss,
    batch_bytes=_segmentation_bytes,
)

RECIPES: dict[str, Recipe] = {
    "zero3-linear": _ZERO3,
    "zero3-linear-fixed": _ZERO3,
    "fsdp2-mlp": Recipe(
        model_name=_name("MLP", "n_layers", "hidden"), build=_mlp, forward_loss=_regression_loss("hidden"),
        batch_bytes=_regression_bytes("hidden"),
    ),
    "fsdp-not-sharding": _SEGMENTATION,
    "fsdp-auto-wrap": _SEGMENTATION,
    "ddp-baseline": _SEGMENTATION,
    "manual-placement": _SEGMENTATION,
}
"""By preset ``program``: the same programs as ``PRESET_STRATEGIES``."""
