"""The TUI tests' fixtures: the time zone, a working directory of their own, recorded runs."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.recorded import copy_runs

STORY2_RUNS = ("h200/zero3-linear", "h200/zero3-linear-fixed", "cpu/fsdp2-mlp")
"""The runs most tests open: story 2 as asked and as fixed on the H200, and fsdp2 on 2 CPU ranks."""


@pytest.fixture(autouse=True, scope="session")
def _utc() -> Iterator[None]:
    """Run lists show local start times: pin the zone so snapshots match everywhere."""
    old = os.environ.get("TZ")
    os.environ["TZ"] = "UTC"
    time.tzset()
    yield
    if old is None:
        os.environ.pop("TZ", None)
    else:
        os.environ["TZ"] = old
    time.tzset()


@pytest.fixture
def recorded_root(tmp_path: Path) -> Path:
    """A runs root with copies of ``STORY2_RUNS``."""
    root = tmp_path / "runs"
    copy_runs(root, *STORY2_RUNS)
    return root


@pytest.fixture
def in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The test's own directory as the working directory: paths are shown relative to it."""
    monkeypatch.chdir(tmp_path)
    return tmp_path
