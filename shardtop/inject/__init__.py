"""Zero-code probing: ``shardtop run -- CMD`` puts the probe into every Python rank of CMD.

The command runs with the run's ``bootstrap/`` directory first on its
``PYTHONPATH``; it holds a ``sitecustomize.py`` (``site/sitecustomize.py``
with the run's settings written in).  Python imports it at start-up, in every
Python process the command starts (torchrun's and deepspeed's launchers, their
ranks, Lightning's rank processes, dataloader workers), on every host a
launcher reaches that passes ``PYTHONPATH`` on (srun, ``mpirun -x``, the
deepspeed launcher over a hostfile): the run directory is where the file is.
It runs the environment's own ``sitecustomize`` (if there is one) and, unless
``SHARDTOP_DISABLE=1``, ``bootstrap.boot()``, which imports nothing heavy:

- ``bootstrap.py``  an import hook and an excepthook, installed at start-up
- ``engines.py``    what the import hook patches once a module loads: Lightning's
                    ``Trainer`` (the callback is added), ``deepspeed.initialize``,
                    FSDP1, FSDP2's ``fully_shard``, DDP, and torch itself
- ``model_hooks.py`` the model found at its first call, forward / backward /
                    optimizer phases and steps from three cheap hooks
- ``this_rank.py``  whether this process is a rank, and its probe
- ``plan_only.py``  ``shardtop plan -- CMD``: the same entry points, patched to describe
                    the model and stop each rank before training (``PLAN_ONLY_ENV``)
- ``plan_first_call.py`` what those patches noted, and the plan traced, written and
                    left with at the model's first call

This module is imported by ``shardtop run`` itself: no torch here either.
"""

from __future__ import annotations

import os

TYPE_CHECKING = False  # typing itself costs a launcher milliseconds: every Python process of the command imports this
if TYPE_CHECKING:
    from collections.abc import Mapping
    from pathlib import Path

INJECT_ENV = "SHARDTOP_INJECT"
"""Set to 1 by ``shardtop run`` for its command: the bootstrap acts only then."""
DISABLE_ENV = "SHARDTOP_DISABLE"
"""1 turns the injection off (the command then runs exactly as without shardtop)."""
PACKAGE_PATH_ENV = "SHARDTOP_PACKAGE_PATH"
"""Where shardtop itself is, for a command whose Python does not have it installed."""
PLAN_ONLY_ENV = "SHARDTOP_PLAN_ONLY"
"""Set by ``shardtop plan -- CMD`` to the directory rank 0 writes its plan into: the bootstrap then patches
the engines to hand the model back unwrapped, and stops each rank at the model's first forward
(``plan_only.py``)."""


BOOTSTRAP_DIR = "bootstrap"
"""In the run directory: what goes first on the command's PYTHONPATH."""

SETTINGS = """\
# Written by `shardtop run` for the run in the directory above this one.  First on a
# command's PYTHONPATH, it carries shardtop's probe into every Python process of the
# command, on every host a launcher passes PYTHONPATH on to.  What follows is
# shardtop/inject/site/sitecustomize.py.
import os as _os

_os.environ.setdefault("{run_dir_env}", _os.path.dirname(_os.path.dirname(_os.path.abspath(__file__))))
_os.environ.setdefault("{inject_env}", "1")
_os.environ.setdefault("{package_env}", {package_path!r})

"""


def write_bootstrap(run_dir: Path) -> Path:
    """The run's ``bootstrap/sitecustomize.py`` (written whole, so hosts joining at once see one file)."""
    from pathlib import Path

    from shardtop.rundir.run_directory import RUN_DIR_ENV

    here = Path(__file__).resolve().parent
    text = SETTINGS.format(
        run_dir_env=RUN_DIR_ENV, inject_env=INJECT_ENV, package_env=PACKAGE_PATH_ENV, package_path=str(here.parents[1])
    ) + (here / "site" / "sitecustomize.py").read_text()
    directory = Path(run_dir) / BOOTSTRAP_DIR
    directory.mkdir(mode=0o700, exist_ok=True)
    tmp = directory / f".sitecustomize.{os.getpid()}.tmp"
    tmp.write_text(text)
    os.replace(tmp, directory / "sitecustomize.py")
    return directory


def plan_env(base: Mapping[str, str], plan_dir: Path) -> dict[str, str]:
    """The environment of a command planned by ``shardtop plan -- CMD``: the bootstrap, in plan-only mode."""
    env = command_env(base, plan_dir)
    env[PLAN_ONLY_ENV] = str(plan_dir)
    return env


def command_env(base: Mapping[str, str], run_dir: Path) -> dict[str, str]:
    """The environment of a command started by ``shardtop run``: its own, the bootstrap first on PYTHONPATH."""
    from shardtop.rundir.run_directory import RUN_DIR_ENV

    env = dict(base)
    path = [str(write_bootstrap(run_dir))] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    env["PYTHONPATH"] = os.pathsep.join(path)
    env[RUN_DIR_ENV] = str(run_dir)
    env[INJECT_ENV] = "1"
    env.setdefault("PYTHONUNBUFFERED", "1")
    return env
