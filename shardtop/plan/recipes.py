"""How each preset's program builds its model and runs it, in the plan's terms.

A recipe names the model (built from ``shardtop.runner.models`` on the meta
device), one batch and the loss as the program computes them, and the
``Strategy`` the program really runs on GPUs and on CPU processes: engine,
units, precision, offload, optimizer, and how the model reaches the engine.
The programs themselves are not imported: they import Lightning (four
seconds), and a plan must be quick.  ``tests/engines/test_plan_presets.py`` checks
that the names copied here (wrapped stacks, halves) match the programs.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from shardtop.plan.description import ModelDescription
from shardtop.plan.strategies import (
    ADAMW,
    LIGHTNING_ZERO,
    SGD_MOMENTUM,
    Strategy,
    ZeroSettings,
)

if TYPE_CHECKING:
    import torch
    from torch import nn

HAND_WRAPPED = ("transformers1", "transformer_0", "transformer_1", "transformers_out")
"""``fsdp_story.HAND_WRAPPED``: the stacks story 1 wraps by hand."""
FIRST_HALF = ("conv1", "bn1", "relu", "transformers1", "conv2", "bn2", "transformer_0")
SECOND_HALF = ("transformer_1", "transformers_out", "conv_out", "out_layer")
"""``manual_placement.FIRST_HALF`` / ``SECOND_HALF``."""


@dataclass(frozen=True)
class Recipe:
    """One preset program: its model, one batch and loss, and the strategy it runs."""

    model_name: Callable[[Mapping[str, Any]], str]
    build: Callable[[Mapping[str, Any]], nn.Module]
    forward_loss: Callable[[Mapping[str, Any]], Callable[[nn.Module], torch.Tensor]]
    batch_bytes: Callable[[Mapping[str, Any]], int]
    asked: Callable[[Mapping[str, Any], ModelDescription, str, int], Strategy]
    """(config, description, accelerator, devices) -> the strategy the program runs."""


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


# -- strategies as the programs run them ---------------------------------------


def _rows(desc: ModelDescription, paths: tuple[str, ...]) -> tuple[int, ...]:
    return tuple(r for r in (desc.row_of(p) for p in paths) if r is not None)


def _rows_of_type(desc: ModelDescription, type_name: str) -> tuple[int, ...]:
    return tuple(r for r, t in enumerate(desc.types) if t == type_name)


def _zero3(fixed: bool) -> Callable[[Mapping[str, Any], ModelDescription, str, int], Strategy]:
    def asked(config: Mapping[str, Any], desc: ModelDescription, accelerator: str, devices: int) -> Strategy:
        lightning = accelerator == "cuda"
        note = ("layers built in configure_model(), inside deepspeed.zero.Init" if fixed else
                "layers built in __init__, outside deepspeed.zero.Init: DeepSpeed moves the whole model "
                "to each device before partitioning it")
        return Strategy(
            engine="zero3", optimizer=ADAMW, built_whole=not fixed, build_note=note,
            driver="lightning" if lightning else "loop", zero=LIGHTNING_ZERO if lightning else ZeroSettings(),
        )

    return asked


def _fsdp2_mlp(config: Mapping[str, Any], desc: ModelDescription, accelerator: str, devices: int) -> Strategy:
    return Strategy(engine="fsdp2", sharding="FULL_SHARD", units=_rows_of_type(desc, "Block"), root_wrapped=True,
                    optimizer=ADAMW, driver="lightning")


def _fsdp_not_sharding(config: Mapping[str, Any], desc: ModelDescription, accelerator: str, devices: int) -> Strategy:
    gpu = accelerator == "cuda"
    return Strategy(
        engine="fsdp1", sharding="FULL_SHARD", precision="fp16-mixed", half_in_units_only=True,
        units=_rows(desc, HAND_WRAPPED), root_wrapped=False, offload_params=gpu, optimizer=SGD_MOMENTUM,
        driver="lightning" if gpu else "loop",
        build_note="four stacks wrapped by hand in configure_sharded_model; the root is not wrapped, so every "
                   "other layer stays whole on each rank",
    )


def _fsdp_auto_wrap(config: Mapping[str, Any], desc: ModelDescription, accelerator: str, devices: int) -> Strategy:
    gpu = accelerator == "cuda"
    return Strategy(
        engine="fsdp1", sharding="FULL_SHARD", precision="fp16-mixed" if gpu else "fp32",
        units=_rows_of_type(desc, "TransformerBlock"), root_wrapped=True, optimizer=SGD_MOMENTUM,
        driver="lightning" if gpu else "loop",
    )


def _ddp(config: Mapping[str, Any], desc: ModelDescription, accelerator: str, devices: int) -> Strategy:
    return Strategy(engine="ddp", optimizer=SGD_MOMENTUM, driver="lightning")


def _manual(config: Mapping[str, Any], desc: ModelDescription, accelerator: str, devices: int) -> Strategy:
    if accelerator != "cuda":
        first = second = "cpu"
    elif devices >= 2:
        first, second = "cuda:0", "cuda:1"
    else:
        first, second = "cuda:0", "cpu"
    return Strategy(engine="manual", optimizer=SGD_MOMENTUM,
                    placement=((first, _rows(desc, FIRST_HALF)), (second, _rows(desc, SECOND_HALF))),
                    build_note=f"first half on {first}, second half on {second}, in one process")


_ZERO3 = Recipe(
    model_name=_name("SequentialLinear", "n_layers", "width"),
    build=_linear_stack,
    forward_loss=_regression_loss("width"),
    batch_bytes=_regression_bytes("width"),
    asked=_zero3(fixed=False),
)
_SEGMENTATION = Recipe(
    model_name=_name("PatchSegmenter", *SEGMENTER_KEYS),
    build=_segmenter,
    forward_loss=_segmentation_loss,
    batch_bytes=_segmentation_bytes,
    asked=_fsdp_not_sharding,
)

RECIPES: dict[str, Recipe] = {
    "zero3-linear": _ZERO3,
    "zero3-linear-fixed": replace(_ZERO3, asked=_zero3(fixed=True)),
    "fsdp2-mlp": Recipe(
        model_name=_name("MLP", "n_layers", "hidden"), build=_mlp, forward_loss=_regression_loss("hidden"),
        batch_bytes=_regression_bytes("hidden"), asked=_fsdp2_mlp,
    ),
    "fsdp-not-sharding": _SEGMENTATION,
    "fsdp-auto-wrap": replace(_SEGMENTATION, asked=_fsdp_auto_wrap),
    "ddp-baseline": replace(_SEGMENTATION, asked=_ddp),
    "manual-placement": replace(_SEGMENTATION, asked=_manual),
}
"""By preset ``program``."""
