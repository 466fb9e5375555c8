"""shardtop: nvtop for sharded training.

``from shardtop import ShardtopCallback`` gives the Lightning callback; it is
imported lazily so that ``import shardtop`` (and ``shardtop --help``) stays
free of torch.
"""

from __future__ import annotations

TYPE_CHECKING = False  # not typing's: every Python process of a `shardtop run` command imports this package
if TYPE_CHECKING:
    from typing import Any

__version__ = "0.1.0"
__all__ = ["ShardtopCallback", "__version__"]


def __getattr__(name: str) -> Any:
    if name == "ShardtopCallback":
        from shardtop.probe.callback import ShardtopCallback

        return ShardtopCallback
    raise AttributeError(f"module 'shardtop' has no attribute {name!r}")
