"""What a rehearsal changes in an engine besides the process group, checked on the engine's own classes:
DeepSpeed's duplicate-parameter check keeps its assertion and answers in one pass."""

from __future__ import annotations

import importlib
from collections.abc import Iterator

import pytest
import torch

from shardtop.inject.rehearsal import patch_deepspeed_engine


class _Engine:
    """What ``_check_for_duplicates`` reads of a ``DeepSpeedEngine``: its module."""

    def __init__(self, module: torch.nn.Module) -> None:
        self.module = module


class _Params(list[torch.nn.Parameter]):
    """A parameter group's list that counts how often it is read through."""

    reads = 0

    def __iter__(self) -> Iterator[torch.nn.Parameter]:
        type(self).reads += 1
        return super().__iter__()


def _groups(*groups: list[torch.nn.Parameter]) -> object:
    return type("Optimizer", (), {"param_groups": [{"params": _Params(g)} for g in groups]})()


def test_the_duplicate_check_still_refuses_a_parameter_in_two_groups_and_takes_one_pass() -> None:
    """One pass: each group is read once, where DeepSpeed's own check reads every group again for each of the
    model's parameters (how long each takes on 2500 layers: ``bench/bench_costs.py``)."""
    engine_module = importlib.import_module("deepspeed.runtime.engine")
    original = engine_module.DeepSpeedEngine._check_for_duplicates

    # patched on a copy of the class's method: the real class stays as it is
    Engine = type("DeepSpeedEngine", (), {"_check_for_duplicates": original})
    patch_deepspeed_engine(type("deepspeed.runtime.engine", (), {"DeepSpeedEngine": Engine}))  # type: ignore[arg-type]
    assert Engine.__dict__["_check_for_duplicates"] is not original
    check = Engine.__dict__["_check_for_duplicates"]

    model = torch.nn.Sequential(*(torch.nn.Linear(2, 2) for _ in range(25)))
    params = list(model.parameters())
    fine = _groups(params[:25], params[25:])
    _Params.reads = 0
    check(_Engine(model), fine)
    assert _Params.reads == 2, "each of the two groups read once"
    _Params.reads = 0
    original(_Engine(model), fine)
    assert _Params.reads >= 2 * len(params), "DeepSpeed's own reads each group again for every parameter"

    twice = _groups(params, params[5:6])
    with pytest.raises(AssertionError, match="occurs multiple times in optimizer.param_groups"):
        check(_Engine(model), twice)
    with pytest.raises(AssertionError, match="occurs multiple times"):
        original(_Engine(model), twice)
