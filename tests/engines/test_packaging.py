"""A non-editable install carries what the package reads at run time, and finds it from anywhere."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tests.support.cli import ROOT


def test_wheel_ships_every_module_the_presets_and_the_stylesheet(tmp_path: Path) -> None:
    pytest.importorskip("setuptools")
    # built from a fresh copy of the sources: a build/ left in the checkout by an earlier build
    # would otherwise be packed again, and could hide files the configuration no longer ships
    source = tmp_path / "source"
    for part in ("shardtop", "presets"):
        shutil.copytree(ROOT / part, source / part, ignore=shutil.ignore_patterns("__pycache__"))
    for part in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / part, source / part)
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
         "-w", str(tmp_path), str(source)],
        check=True, capture_output=True, timeout=300,
    )
    (wheel,) = tmp_path.glob("shardtop-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    presets = sorted(p.stem for p in (ROOT / "presets").glob("*.yaml"))
    assert presets, "the top-level presets/ directory holds the preset files"
    assert not (ROOT / "shardtop" / "presets").exists(), "the presets live in presets/, not inside the package"
    assert {f"shardtop/presets/{p}.yaml" for p in presets} <= names
    assert "shardtop/tui/shardtop.tcss" in names
    assert "shardtop/inject/site/sitecustomize.py" in names  # the bootstrap of `shardtop run`
    modules = {p.relative_to(ROOT).as_posix() for p in (ROOT / "shardtop").rglob("*.py")}
    assert modules <= names, f"modules missing from the wheel (add their package to pyproject.toml): {modules - names}"
    assert not any(n.startswith(("tests/", "presets/")) for n in names)

    # installed from the wheel, run from an unrelated directory: the presets are found inside the package
    site = tmp_path / "site"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-index", "--target", str(site), str(wheel)],
        check=True, capture_output=True, timeout=300,
    )
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    code = "from shardtop.config import preset_names as n, presets_dir as d; print(d()); print(' '.join(n()))"
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=elsewhere, capture_output=True, text=True, timeout=120,
        env={**os.environ, "PYTHONPATH": str(site)},
    )
    assert done.returncode == 0, done.stderr
    where, listed = done.stdout.splitlines()
    assert Path(where).is_relative_to(site), where
    assert listed.split() == presets
