"""The code is typed throughout and lint-clean: ``mypy`` (strict) and ``ruff check`` find nothing.

Both read their settings from pyproject.toml.  mypy starts from an empty cache, as on a fresh
clone, with the first engines test (``tests/engines/conftest.py``): about 30 s of one core beside the
other tests; ruff takes well under a second.
"""

from __future__ import annotations

import subprocess
import sys

from tests.support.cli import ROOT
from tests.support.lint import MypyRun


def test_mypy_strict_finds_no_error(mypy_run: MypyRun) -> None:
    code, out = mypy_run.result()
    assert code == 0, f"mypy found errors (run `mypy` in the repository):\n{out}"


def test_ruff_finds_nothing() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "ruff", "check", "--no-cache", "shardtop", "tests", "bench"],
        cwd=ROOT, capture_output=True, text=True, timeout=120, check=False,
    )
    assert done.returncode == 0, (
        f"ruff found problems (run `ruff check shardtop tests bench`):\n{done.stdout}{done.stderr}"
    )
