"""Plans of the presets: a resolved preset config in, a ``Plan`` out.

The model description is the only costly part (the model is built on the
meta device and one forward pass is traced); it is cached per program, model
sizes and batch size, so replanning with other devices, GPU or strategy costs
milliseconds.  ``describe_preset`` imports torch; ``plan_config`` does too
the first time a description is made.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any

from shardtop.config import ConfigError, flatten
from shardtop.plan.cards import Gpu
from shardtop.plan.compare import Plan, make_plan
from shardtop.plan.description import ModelDescription
from shardtop.plan.recipes import RECIPES

DescriptionKey = tuple[str, tuple[tuple[str, Any], ...], int]
"""(program, model sizes, batch size): what a preset's description depends on, and nothing else."""


def description_key(config: Mapping[str, Any]) -> DescriptionKey:
    """What ``describe_preset`` depends on: equal keys, equal descriptions (no torch)."""
    program = str(config["program"])
    if program not in RECIPES:
        raise ConfigError(f"preset program {program!r} has no plan recipe; plannable: {', '.join(sorted(RECIPES))}.")
    return program, tuple(sorted(flatten(config.get("model") or {}).items())), int(config["batch_size"])


def describe_preset(config: Mapping[str, Any]) -> ModelDescription:
    """The description of a resolved preset's model at its batch size (cached)."""
    return _describe(*description_key(config))


@functools.lru_cache(maxsize=32)
def _describe(program: str, sizes: tuple[tuple[str, Any], ...], batch_size: int) -> ModelDescription:
    from shardtop.plan.describe import describe_model
    from shardtop.plan.meta import build_on_meta

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


def _unflatten(items: tuple[tuple[str, Any], ...]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in items:
        node = out
        *parents, last = key.split(".")
        for p in parents:
            node = node.setdefault(p, {})
        node[last] = value
    return out


def plan_config(config: Mapping[str, Any], *, devices: int, accelerator: str, gpu: Gpu | None) -> Plan:
    """The plan of a resolved preset config (CPU defaults already applied for ``accelerator=cpu``)."""
    return plan_described(config, describe_preset(config), devices=devices, accelerator=accelerator, gpu=gpu)


def plan_described(
    config: Mapping[str, Any], desc: ModelDescription, *, devices: int, accelerator: str, gpu: Gpu | None
) -> Plan:
    """The plan of a preset whose description is in hand: pure and torch-free, milliseconds (a launch prompt
    replans on every key)."""
    asked = RECIPES[str(config["program"])].asked(config, desc, accelerator, devices)
    return make_plan(
        desc, asked, devices=devices, gpu=gpu, accelerator=accelerator, preset=str(config.get("preset", ""))
    )
