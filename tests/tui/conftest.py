"""Shared pieces of the TUI tests: recorded hardware, recorded runs, waiting on the app."""

from __future__ import annotations

import asyncio
import inspect
import json
import os
import shutil
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.tui.recorded import (  # noqa: F401 - re-exported for the tests
    HOST,
    RecordedGpus,
    RecordedHost,
    fsdp2_cpu_run,
    h200_pair,
    h200_processes,
    zero3_oom_run,
)

FIXTURE_RUNS = (
    Path(__file__).resolve().parent / "fixtures" / "runs",
    Path(__file__).resolve().parent.parent / "fixtures" / "runs",
)
"""Runs recorded with the real probe (``shardtop launch ... --headless``), committed."""


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem: pytest.Function) -> bool | None:
    """Run ``async def`` tests (Pilot needs an event loop) without an extra plugin."""
    if not inspect.iscoroutinefunction(pyfuncitem.obj):
        return None
    wanted = inspect.signature(pyfuncitem.obj).parameters
    asyncio.run(pyfuncitem.obj(**{name: pyfuncitem.funcargs[name] for name in wanted}))
    return True


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
    """A runs root with story 2's GPU OOM and a finished CPU fsdp2 run."""
    root = tmp_path / "runs"
    root.mkdir(mode=0o700)
    zero3_oom_run(root)
    fsdp2_cpu_run(root)
    return root


def copy_fixture_runs(dest: Path, preset: str = "fsdp2-mlp") -> list[Path]:
    """The committed real runs of ``preset``, copied (a test may write into a run directory)."""
    dest.mkdir(parents=True, exist_ok=True, mode=0o700)
    out = []
    found = sorted(p for base in FIXTURE_RUNS for p in base.glob("*/run.json"))
    for run in found:
        target = dest / run.parent.name
        if json.loads(run.read_text()).get("preset") != preset or target.exists():
            continue
        shutil.copytree(run.parent, target)
        out.append(target)
    return out


async def wait_for(pilot: object, condition: Callable[[], object], timeout: float = 10.0, what: str = "") -> None:
    """Let the app run until ``condition()`` is true; fail with ``what`` after ``timeout``."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what or condition}")
        await pilot.pause(0.05)  # type: ignore[attr-defined]
