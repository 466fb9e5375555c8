"""Plans of the presets: a resolved preset config in, a ``Plan`` out.

The model description is the only costly part (the model is built on the
meta device and one forward pass is traced); it is cached per program, model
sizes and batch size, so replanning with other devices, GPU or strategy costs
milliseconds (``shardtop.plan.presets.plan_described``, torch-free).
``describe_preset`` imports torch; ``plan_config`` does too the first time a
description is made.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any

from shardtop.config import set_dotted
from shardtop.plan.cards import Gpu
from shardtop.plan.compare import Plan
from shardtop.plan.description import ModelDescription
from shardtop.plan.presets import description_key, plan_described
from shardtop.trace.recipes import RECIPES


def describe_preset(config: Mapping[str, Any]) -> ModelDescription:
    """The description of a resolved preset's model at its batch size (cached)."""
    return _describe(*description_key(config))


@functools.lru_cache(maxsize=32)
def _describe(program: str, sizes: tuple[tuple[str, Any], ...], batch_size: int) -> ModelDescription:
    from shardtop.trace.describe import describe_model
    from shardtop.trace.meta import build_on_meta

    config = {"model": _unflatten(sizes), "batch_size": batch_size}
    recipe = RECIPES[program]
    model = build_on_meta(lambda: recipe.build(config))
    return describe_model(
        model,
        recipe.forward_loss(config),
        name=recipe.model_name(config),
        batch_size=batch_size,
        input_bytes=recipe.batch_bytes(config),
    )


def _unflatten(items: tuple[tuple[str, Any], ...]) -> dict[str, object]:
    out: dict[str, object] = {}
    for key, value in items:
        set_dotted(out, key, value)
    return out


def plan_config(config: Mapping[str, Any], *, devices: int, accelerator: str, gpu: Gpu | None) -> Plan:
    """The plan of a resolved preset config (CPU defaults already applied for ``accelerator=cpu``)."""
    return plan_described(config, describe_preset(config), devices=devices, accelerator=accelerator, gpu=gpu)
