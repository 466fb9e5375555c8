"""shardtop's bootstrap, first on the PYTHONPATH of a command started by ``shardtop run``.

``shardtop run`` writes this file, with the run's settings above it, into the
run's ``bootstrap/`` directory (``shardtop.inject.write_bootstrap``).  Python
imports the first ``sitecustomize`` on its path at start-up: this one.  It
runs the one it hides (the environment's own, if any), then, unless
``SHARDTOP_DISABLE=1``, ``shardtop.inject.bootstrap.boot()``, which installs
an import hook and imports nothing heavy.  Nothing here may stop the command
from running: a probe that cannot load says so on stderr, once.
"""

import os
import sys


def _run_hidden_sitecustomize() -> None:
    from importlib.machinery import PathFinder

    here = os.path.dirname(os.path.abspath(__file__))
    others = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
    spec = PathFinder.find_spec("sitecustomize", others)
    if spec is None or spec.loader is None:
        return
    import importlib.util

    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)


def _load_shardtop(path: str) -> None:
    """The shardtop that wrote this file, even where the command's Python has another (or none):
    first on the path for this one import only; then last, for its dependencies, so that the
    command's own packages win."""
    if "shardtop" in sys.modules:
        return
    sys.path.insert(0, path)
    try:
        import shardtop  # noqa: F401
    finally:
        sys.path.remove(path)
    if path not in sys.path:
        sys.path.append(path)


def _boot() -> None:
    if os.environ.get("SHARDTOP_INJECT") != "1" or os.environ.get("SHARDTOP_DISABLE") == "1":
        return
    try:
        path = os.environ.get("SHARDTOP_PACKAGE_PATH")
        if path:
            _load_shardtop(path)
        from shardtop.inject.bootstrap import boot

        boot()
    except Exception as e:  # noqa: BLE001 - the command runs, without the probe
        sys.stderr.write(f"shardtop: the probe cannot load in this Python ({type(e).__name__}: {e}); "
                         "the command runs without it.\n")


try:
    _run_hidden_sitecustomize()
finally:
    _boot()
