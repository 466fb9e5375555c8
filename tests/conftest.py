"""The suite's layers, by directory: ``unit`` (pure and fast), ``engines`` (processes that take
seconds: ranks over gloo, real engines, runs of shardtop, mypy and a wheel build) and ``tui``
(the app driven by Pilot, and its snapshots).  Each test is marked with its layer, so
``pytest -m "not engines"`` leaves out the slow processes and ``pytest`` runs everything.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
LAYERS = ("unit", "engines", "tui")

# The tests start `python`, `torchrun`, `deepspeed` and `shardtop` by name, as a user types them: the
# ones of the interpreter running the tests, also when its environment was not activated.
os.environ["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark every test with the layer of the directory it lives in."""
    for item in items:
        try:
            layer = Path(item.path).resolve().relative_to(TESTS).parts[0]
        except ValueError:
            continue
        if layer in LAYERS:
            item.add_marker(getattr(pytest.mark, layer))


@pytest.fixture
def runs_dir(tmp_path: Path) -> Path:
    return tmp_path / "runs"
