"""The probe finds a graph's tensors among every object of a process by their type: each subclass of
``torch.Tensor`` counts, those a library or the script defines after the probe loaded included."""

from __future__ import annotations

import gc

import torch
from torch import nn

from shardtop.probe.activations import tensor_types


class Tagged(torch.Tensor):
    """A user's tensor subclass, as libraries make them."""


class TaggedMore(Tagged):
    pass


def test_every_tensor_subclass_is_a_tensor_type_and_nothing_else() -> None:
    kinds = tensor_types()
    assert {torch.Tensor, nn.Parameter, Tagged, TaggedMore} <= kinds
    assert not kinds & {int, dict, nn.Module, torch.Size}
    held = [torch.zeros(1), nn.Parameter(torch.zeros(1)), torch.zeros(2).as_subclass(TaggedMore)]
    objects = gc.get_objects()
    found = [id(o) for o in objects if type(o) in kinds]
    assert found == [id(o) for o in objects if issubclass(type(o), torch.Tensor)] and len(found) >= len(held)
