"""A non-editable install carries what the package reads at run time."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from shardtop.config import preset_names
from tests.conftest import ROOT


def test_wheel_ships_presets_and_stylesheet(tmp_path: Path) -> None:
    pytest.importorskip("setuptools")
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(tmp_path), str(ROOT)],
        check=True, capture_output=True, timeout=300,
    )
    (wheel,) = tmp_path.glob("shardtop-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    assert {f"shardtop/presets/{p}.yaml" for p in preset_names()} <= names
    assert "shardtop/tui/shardtop.tcss" in names
    assert not any(n.startswith("tests/") for n in names)
