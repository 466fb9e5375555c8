"""Synthetic data: the presets measure memory, not accuracy.

A few distinct batches are made and repeated (Lightning runs epochs until
``max_steps``; raw loops cycle), so a long run costs no more memory than a short one.
"""

from __future__ import annotations

import torch
from torch.utils.data import DataLoader, TensorDataset

DISTINCT_BATCHES = 16


def regression_loader(
    n_batches: int, batch_size: int, features: int, seed: int
) -> DataLoader[tuple[torch.Tensor, ...]]:
    n_batches = min(n_batches, DISTINCT_BATCHES)
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n_batches * batch_size, features, generator=g)
    y = torch.randn(n_batches * batch_size, features, generator=g)
    return DataLoader(TensorDataset(x, y), batch_size=batch_size)


def segmentation_loader(
    n_batches: int, batch_size: int, image: int, classes: int, seed: int
) -> DataLoader[tuple[torch.Tensor, ...]]:
    n_batches = min(n_batches, DISTINCT_BATCHES)
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n_batches * batch_size, 3, image, image, generator=g)
    y = torch.randint(0, classes, (n_batches * batch_size, image, image), generator=g)
    return DataLoader(TensorDataset(x, y), batch_size=batch_size)
