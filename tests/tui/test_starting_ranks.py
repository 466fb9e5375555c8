"""A rank that is still starting says what it is doing where the run knows it: the build running under its
process (DeepSpeed's CPU op on a first launch), its empty log; nothing it does not know."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from shardtop.tui.app import ShardtopApp
from shardtop.tui.watch.rank_builds import ChildProcess, build_words
from shardtop.tui.widgets.shard_tree import ShardTree
from tests.support.first_minutes import FIRST_LAUNCH, live_head
from tests.support.recorded import H200_HOST, RecordedHost, recorded_h200
from tests.support.waiting import wait_for

COMPILING = (
    "import subprocess; "
    "subprocess.run(['c++', '-DTORCH_EXTENSION_NAME=demo_op', '-x', 'c++', '-fsyntax-only', '-'])"
)
"""A rank's process that compiles as DeepSpeed's op builder does: c++ under it, reading its source (which
never comes: the compiler runs until the test ends it)."""


@pytest.fixture
def ranks() -> Iterator[tuple[subprocess.Popen[bytes], subprocess.Popen[bytes]]]:
    """Two rank processes: rank 0 compiling a torch extension, rank 1 waiting."""
    assert shutil.which("c++"), "a C++ compiler is needed here, as DeepSpeed's op builder needs one"
    compiling = subprocess.Popen([sys.executable, "-c", COMPILING], stdin=subprocess.PIPE)
    waiting = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    try:
        yield compiling, waiting
    finally:
        for p in (compiling, waiting):
            for child in _children(p.pid):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(child, signal.SIGTERM)
            p.kill()
            p.communicate()  # waits, and closes the compiler's stdin


def _children(pid: int) -> list[int]:
    import psutil

    try:
        return [c.pid for c in psutil.Process(pid).children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


async def test_a_starting_rank_says_what_it_builds(
    in_tmp: Path, ranks: tuple[subprocess.Popen[bytes], subprocess.Popen[bytes]]
) -> None:
    """The first launch before the ranks said hello (their memory samples only), on this host: rank 0's
    process runs c++ on a torch extension, rank 1's runs nothing; neither has written a log line."""
    compiling, waiting = ranks
    run = live_head(in_tmp / "runs", FIRST_LAUNCH, until="hello", rank_pids={0: compiling.pid, 1: waiting.pid})
    app = ShardtopApp(in_tmp / "runs", run=str(run), refresh=0.2, gpu_source=recorded_h200(),  # type: ignore[arg-type]
                      host_probe=RecordedHost(H200_HOST))  # type: ignore[arg-type]
    async with app.run_test(size=(160, 48)) as pilot:
        tree = app.screen.query_one(ShardTree)
        await wait_for(pilot, lambda: "demo_op" in tree.empty_words, timeout=20, what="the build under rank 0")
        words = tree.empty_words.splitlines()
        r0 = next(line for line in words if line.startswith("r0: "))
        r1 = next(line for line in words if line.startswith("r1: "))
        assert r0.startswith("r0: starting, building the torch extension demo_op (c++, ")
        assert r0.endswith(" so far), nothing in its log yet")
        assert r1 == "r1: starting, nothing in its log yet", "nothing is said that the run does not know"


def test_build_words_name_the_extension_or_only_the_program() -> None:
    ninja = ChildProcess("ninja", ("ninja", "-v"), 100.0)
    cxx = ChildProcess("c++", ("c++", "-DTORCH_EXTENSION_NAME=deepspeed_shm_comm", "-c", "shm.cpp"), 101.0)
    cc1 = ChildProcess("cc1plus", ("/usr/lib/gcc/cc1plus", "-D", "TORCH_EXTENSION_NAME=deepspeed_shm_comm"), 101.5)
    worker = ChildProcess("python3", ("python3", "-c", "work()"), 90.0)
    assert build_words((ninja, cxx, cc1, worker), 122.0) == (
        "building the torch extension deepspeed_shm_comm (c++, 21s so far)"
    )
    assert build_words((ninja, worker), 103.0) == "running ninja (3s so far)"
    assert build_words((worker,), 103.0) == "", "a child that builds nothing is not told"
