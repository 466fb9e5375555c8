"""What each rank holds of a parameter, as the engines cut it: worked out from the parameter's shape alone."""

from __future__ import annotations

import math


def zero3_share(numel: int, world: int, rank: int) -> int:
    """Elements of a ZeRO-3 parameter in ``rank``'s partition: partitions of ``ceil(numel / world)``, the last short."""
    size = math.ceil(numel / world)
    return max(0, min(size, numel - rank * size))


def dim0_share(shape: tuple[int, ...], world: int, rank: int) -> int:
    """Elements of an FSDP2 parameter (``Shard(0)``) on ``rank``: chunks of ``ceil(rows / world)`` rows, as
    ``torch.chunk`` cuts them, the last ones short or empty."""
    rows, per_row = shape[0], math.prod(shape[1:])
    return zero3_share(rows, world, rank) * per_row
