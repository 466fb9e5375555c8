"""The frameworks' own virtual environments, made the way a user makes them.

Each framework pins its own versions of transformers, lightning or datasets,
so each gets an environment of its own, under ``$SHARDTOP_FRAMEWORKS_DIR``
(default: ``.fw/`` in the checkout, which git ignores).  It is built in the
order a CPU user must follow: ``torch==2.13.0`` first (the CPU build; a looser
requirement pulls a CUDA build of several GB), then shardtop from this checkout
(the base package, as ``pip install -e``), then the framework with torch held
where it is.  A file in the environment records what it was built from; an
environment built from anything else is built again.  Two processes building
the same environment take turns (a lock file beside it).
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path

from tests.support.cli import ROOT

TORCH = "torch==2.13.0"
"""The CPU build on this machine's disk: installed first, and held through every later install."""
DIRECTORY_VARIABLE = "SHARDTOP_FRAMEWORKS_DIR"
BUILT_FROM = "shardtop-frameworks.json"
INSTALL_TIMEOUT = 1200


@dataclass(frozen=True)
class Framework:
    """A framework as its users install it: a name and the pip requirements beside torch and shardtop."""

    name: str
    requirements: tuple[str, ...]
    imports: tuple[str, ...]
    """Modules the environment must import once built."""


TRL = Framework(
    "trl",
    ("trl==1.16.0", "deepspeed==0.19.8", "transformers==5.25.0", "accelerate==1.16.0"),
    ("trl", "deepspeed", "accelerate"),
)
TORCHTITAN = Framework("torchtitan", ("torchtitan==0.3.0", "triton==3.9.0"), ("torchtitan.train",))
TORCHTUNE = Framework("torchtune", ("torchtune==0.6.1", "torchao==0.15.0"), ("torchtune.training.quantization",))
LITGPT = Framework("litgpt", ("litgpt==0.5.13", "lightning==2.6.6", "requests"), ("litgpt.finetune.full",))
AXOLOTL = Framework("axolotl", ("axolotl[deepspeed]==0.19.0", "deepspeed==0.18.9"), ("axolotl.cli.train", "deepspeed"))


@dataclass(frozen=True)
class BuiltFrom:
    """What an environment was built from: a change to any of it builds the environment again."""

    torch: str
    checkout: str
    requirements: tuple[str, ...]
    python: str


@dataclass(frozen=True)
class Environment:
    """A framework's virtual environment: its ``bin/`` goes first on PATH, as ``activate`` would put it."""

    framework: Framework
    root: Path

    @property
    def bin(self) -> Path:
        return self.root / "bin"

    @property
    def python(self) -> Path:
        return self.bin / "python"

    @property
    def site_packages(self) -> Path:
        version = f"python{sys.version_info.major}.{sys.version_info.minor}"
        return self.root / "lib" / version / "site-packages"


class InstallFailed(RuntimeError):
    """A step of an environment's install failed: the command and what it printed."""


def frameworks_dir() -> Path:
    return Path(os.environ.get(DIRECTORY_VARIABLE) or ROOT / ".fw")


def environment(framework: Framework) -> Environment:
    """The framework's environment, built first if it is missing or was built from something else."""
    env = Environment(framework, frameworks_dir() / framework.name)
    wanted = BuiltFrom(TORCH, str(ROOT), framework.requirements, sys.version.split()[0])
    with _lock(env.root.with_name(f"{framework.name}.lock")):
        if _built_from(env) != wanted:
            _build(env, wanted)
    return env


def _built_from(env: Environment) -> BuiltFrom | None:
    try:
        recorded = json.loads((env.root / BUILT_FROM).read_text())
        return BuiltFrom(**{**recorded, "requirements": tuple(recorded["requirements"])})
    except (OSError, ValueError, TypeError, KeyError):
        return None


def _build(env: Environment, wanted: BuiltFrom) -> None:
    shutil.rmtree(env.root, ignore_errors=True)
    env.root.parent.mkdir(parents=True, exist_ok=True)
    _step([sys.executable, "-m", "venv", str(env.root)])
    pip = [str(env.python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
    _step([*pip, TORCH])
    _step([*pip, "-e", str(ROOT)])
    _step([*pip, TORCH, *env.framework.requirements])
    checks = "; ".join(f"import {module}" for module in env.framework.imports)
    _step([str(env.python), "-c", f"import torch; assert torch.__version__.startswith('2.13.0'); {checks}"])
    (env.root / BUILT_FROM).write_text(json.dumps(asdict(wanted), indent=1))


def _step(command: list[str]) -> None:
    done = subprocess.run(command, capture_output=True, text=True, timeout=INSTALL_TIMEOUT, check=False)
    if done.returncode != 0:
        said = f"{done.stdout[-4000:]}{done.stderr[-4000:]}"
        raise InstallFailed(f"`{' '.join(command)}` exited {done.returncode}:\n{said}")


@contextmanager
def _lock(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
