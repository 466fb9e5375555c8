"""What each rank should hold, worked out from the framework's own model, and the same read from a report.

The model's parameters come from the framework's own config, built in its own
environment (each script's ``inventory``: module path -> the shapes of the
module's own parameters).  The shares follow each engine's documented layout:
FSDP2 splits every parameter along its first dimension, ZeRO-3 splits every
parameter flat and keeps those at or under its persistence threshold whole
beside their part, FSDP1 splits each unit's flat parameter, DDP keeps
everything whole.  Padding is never counted as held.
"""

from __future__ import annotations

import json
import math
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

FP32 = 4


@dataclass(frozen=True)
class Inventory:
    """A model's parameters as its framework builds them from its config: module path -> own parameter shapes."""

    shapes: dict[str, list[list[int]]]
    extra: dict[str, Any]

    @property
    def params_by_module(self) -> dict[str, int]:
        """Modules that own parameters, and how many."""
        counts = {path: sum(numel(shape) for shape in shapes) for path, shapes in self.shapes.items()}
        return {path: count for path, count in counts.items() if count}

    @property
    def params(self) -> int:
        return sum(self.params_by_module.values())

    @property
    def bytes(self) -> int:
        return self.params * FP32

    def under(self, prefix: str) -> int:
        """Parameters of the module at ``prefix`` and below."""
        return sum(count for path, count in self.params_by_module.items() if within(path, prefix))


def read_inventory(python: Path, script: list[str], cwd: Path) -> Inventory:
    """Run a script's ``inventory`` in the framework's environment; its last line of output is the JSON."""
    done = subprocess.run([str(python), *script], cwd=cwd, capture_output=True, text=True, timeout=300, check=False)
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    assert done.returncode == 0 and lines, f"inventory failed (exit {done.returncode}):\n{done.stdout}{done.stderr}"
    found = json.loads(lines[-1])
    return Inventory(found.pop("modules"), found)


def numel(shape: list[int]) -> int:
    return math.prod(shape)


def within(path: str, prefix: str) -> bool:
    return prefix == "" or path == prefix or path.startswith(prefix + ".")


def share(length: int, world: int, rank: int) -> int:
    """Elements of ``length`` that ``rank`` of ``world`` holds, chunks of ``ceil(length / world)`` in rank order."""
    chunk = math.ceil(length / world)
    return max(0, min(chunk, length - rank * chunk))


def fsdp2_bytes(inventory: Inventory, world: int, rank: int) -> dict[str, int]:
    """FSDP2 (``fully_shard``): every parameter split along its first dimension."""
    return {path: sum(share(shape[0], world, rank) * numel(shape[1:]) * FP32 for shape in shapes)
            for path, shapes in inventory.shapes.items() if shapes}


def zero3_bytes(inventory: Inventory, world: int, rank: int, threshold: int) -> dict[str, int]:
    """ZeRO-3: every parameter split flat; one of at most ``threshold`` elements also kept whole beside its part.

    DeepSpeed partitions a persistent parameter like any other (the optimizer steps on the part) and
    then keeps the gathered whole as well, on every rank, instead of releasing it after each use.
    """
    def held(shape: list[int]) -> int:
        count = numel(shape)
        return share(count, world, rank) + (count if count <= threshold else 0)

    return {path: sum(held(shape) for shape in shapes) * FP32 for path, shapes in inventory.shapes.items() if shapes}


def fsdp1_rank_bytes(inventory: Inventory, units: list[str], world: int, rank: int) -> int:
    """FSDP1: each unit (the modules at ``units``, then the root holding the rest) split as one flat parameter."""
    sizes = [inventory.under(unit) for unit in units]
    sizes.append(inventory.params - sum(sizes))
    return sum(share(size, world, rank) for size in sizes) * FP32


def whole_bytes(inventory: Inventory) -> dict[str, int]:
    """DDP and unsharded models: every rank holds everything."""
    return {path: count * FP32 for path, count in inventory.params_by_module.items()}


def report_params(report: dict[str, Any]) -> dict[str, int]:
    """Modules of the report's tree that own parameters, and how many."""
    return {m["path"]: m["params"] for m in report["modules"] if m["params"]}


def held_by(report: dict[str, Any], rank: int) -> dict[str, int]:
    """Bytes each module's own parameters take on ``rank``, as the report's tree says."""
    held: dict[str, int] = {}
    for module in report["modules"]:
        for entry in module["ranks"]:
            if entry["rank"] == rank and module["params"]:
                held[module["path"]] = entry["bytes"]
    return held


def rank_entry(report: dict[str, Any], rank: int) -> dict[str, Any]:
    found = [entry for entry in report["ranks"] if entry["rank"] == rank]
    assert found, f"no rank {rank} in the report: ranks {[e['rank'] for e in report['ranks']]}"
    entry: dict[str, Any] = found[0]
    return entry


def units(report: dict[str, Any]) -> dict[str, str]:
    """Modules of the report's tree where a unit of sharding is rooted, and its kind."""
    return {m["path"]: m["unit"] for m in report["modules"] if m.get("unit")}
