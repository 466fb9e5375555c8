from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

# The tests start `python`, `torchrun`, `deepspeed` and `shardtop` by name, as a user types them: the
# ones of the interpreter running the tests, also when its environment was not activated.
os.environ["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])


def shardtop(
    *args: str, runs_dir: Path, timeout: float = 600, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """Run the real ``shardtop`` command as a user would."""
    full_env = {**os.environ, "SHARDTOP_RUNS_DIR": str(runs_dir), "PYTHONUNBUFFERED": "1", **(env or {})}
    return subprocess.run(
        [sys.executable, "-m", "shardtop", *args],
        capture_output=True, text=True, timeout=timeout, env=full_env, cwd=ROOT,
    )


@pytest.fixture
def runs_dir(tmp_path: Path) -> Path:
    return tmp_path / "runs"
