"""Shared pieces of the TUI tests: recorded hardware, recorded runs, waiting on the app."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.recorded import (  # noqa: F401 - re-exported for the tests
    H200_HOST,
    RecordedGpus,
    RecordedHost,
    copy_runs,
    recorded_h200,
)
from tests.support.waiting import settled, wait_for  # noqa: F401 - re-exported for the tests

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
