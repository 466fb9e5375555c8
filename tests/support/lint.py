"""mypy over the package, started as soon as the session knows it will ask: it takes about 30 s of one
core on a fresh clone, and runs beside the tests before it instead of adding its time to theirs."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from tests.support.cli import ROOT


@dataclass
class MypyRun:
    process: subprocess.Popen[str]
    cache: Path

    def result(self, timeout: float = 600) -> tuple[int, str]:
        """mypy's exit code and what it printed; waits for it to end."""
        try:
            out, _ = self.process.communicate(timeout=timeout)
        finally:
            shutil.rmtree(self.cache, ignore_errors=True)
        return self.process.returncode, out

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()
        shutil.rmtree(self.cache, ignore_errors=True)


def start_mypy() -> MypyRun:
    """``mypy`` with the repository's settings (pyproject.toml), from an empty cache, as on a fresh clone."""
    cache = Path(tempfile.mkdtemp(prefix="shardtop-mypy-"))
    process = subprocess.Popen(
        [sys.executable, "-m", "mypy", "--no-incremental", "--cache-dir", str(cache)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    return MypyRun(process, cache)
