"""What a rehearsal changes in an engine besides the process group, checked on the engine's own classes:
DeepSpeed's duplicate-parameter check keeps its assertion and answers in one pass."""

from __future__ import annotations

import importlib
import time

import pytest
import torch

from shardtop.inject.rehearsal import patch_deepspeed_engine


class _Engine:
    """What ``_check_for_duplicates`` reads of a ``DeepSpeedEngine``: its module."""

    def __init__(self, module: torch.nn.Module) -> None:
        self.module = module


def test_the_duplicate_check_still_refuses_a_parameter_in_two_groups_and_takes_one_pass() -> None:
    engine_module = importlib.import_module("deepspeed.runtime.engine")
    original = engine_module.DeepSpeedEngine._check_for_duplicates

    # patched on a copy of the class's method: the real class stays as it is
    Engine = type("DeepSpeedEngine", (), {"_check_for_duplicates": original})
    patch_deepspeed_engine(type("deepspeed.runtime.engine", (), {"DeepSpeedEngine": Engine}))  # type: ignore[arg-type]
    assert Engine.__dict__["_check_for_duplicates"] is not original
    check = Engine.__dict__["_check_for_duplicates"]

    model = torch.nn.Sequential(*(torch.nn.Linear(2, 2) for _ in range(2500)))
    params = list(model.parameters())
    fine = type("Optimizer", (), {"param_groups": [{"params": params[:2500]}, {"params": params[2500:]}]})()
    started = time.perf_counter()
    check(_Engine(model), fine)
    patched_seconds = time.perf_counter() - started
    started = time.perf_counter()
    original(_Engine(model), fine)
    original_seconds = time.perf_counter() - started
    assert patched_seconds * 20 < original_seconds, (patched_seconds, original_seconds)

    twice = type("Optimizer", (), {"param_groups": [{"params": params}, {"params": params[5:6]}]})()
    with pytest.raises(AssertionError, match="occurs multiple times in optimizer.param_groups"):
        check(_Engine(model), twice)
    with pytest.raises(AssertionError, match="occurs multiple times"):
        original(_Engine(model), twice)
