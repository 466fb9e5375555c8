"""What the memory sources must report for ``shard_workers.TinyNet``, from its shapes alone."""

from __future__ import annotations

from typing import Any

from shardtop.rundir.events import tree_paths
from tests.support.shard_workers import DIM, VOCAB

TOKENS = 4 * 5
"""``tokens()``: a batch of 4 sequences of 5."""


def saved_per_module(itemsize: int = 4, tokens: int = TOKENS, prefix: str = "") -> dict[str, int]:
    """What each module's own forward saves for backward.

    The embedding saves its int64 indices; a block's Linear its input, its LayerNorm its input
    plus a mean and a reciprocal deviation per position, the block itself the ReLU's output; the
    model's ReLU its output, which the head saves again (counted once, at the ReLU).
    """
    x = tokens * DIM * itemsize
    saved = {"embed": tokens * 8, "act": x}
    for i in range(3):
        saved.update({f"blocks.{i}": x, f"blocks.{i}.ff": x, f"blocks.{i}.norm": x + 2 * tokens * itemsize})
    return {f"{prefix}{path}": nbytes for path, nbytes in saved.items()}


def saved_by_the_loss(tokens: int = TOKENS) -> int:
    """``pow(2)`` of the float32 output, outside every module."""
    return tokens * VOCAB * 4


def act_by_path(staged: dict[str, Any]) -> dict[str, int]:
    """The non-zero ``act_bytes`` of a worker's result, by module path."""
    tree, shards = staged["tree"], staged["shards"]
    return {p: b for p, b in zip(tree_paths(tree["names"], tree["parents"]), shards["act_bytes"], strict=True) if b}


def check_activations(results: list[dict[str, Any]], key: str | None = None, itemsize: int = 4) -> None:
    """Every module's saved bytes, and the census's activations at the end of the forward, on every rank."""
    expected = saved_per_module(itemsize)
    for result in results:
        assert act_by_path(result[key] if key else result) == expected
        assert result["kinds"]["forward"]["activations"] == sum(expected.values()) + saved_by_the_loss()
        assert result["kinds"]["backward"].get("activations") is None  # not followed outside a forward here
