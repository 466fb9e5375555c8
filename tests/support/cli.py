"""The real ``shardtop`` command, run as a user runs it, and the repository it runs in."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
"""The repository: the tests start commands from here."""


def shardtop(
    *args: str, runs_dir: Path, timeout: float = 600, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """Run the real ``shardtop`` command as a user would."""
    full_env = {**os.environ, "SHARDTOP_RUNS_DIR": str(runs_dir), "PYTHONUNBUFFERED": "1", **(env or {})}
    return subprocess.run(
        [sys.executable, "-m", "shardtop", *args],
        capture_output=True, text=True, timeout=timeout, env=full_env, cwd=ROOT,
    )


def report(path: Path, fmt: str = "text") -> str:
    """``shardtop report`` of the run in ``path``, in format ``fmt``: its output, which must be a clean one."""
    done = shardtop("report", str(path), "--format", fmt, runs_dir=path.parent, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr
    return done.stdout
