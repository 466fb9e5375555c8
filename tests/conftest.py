"""The suite's layers, by directory: ``unit`` (pure and fast), ``engines`` (processes that take
seconds: ranks over gloo, real engines, runs of shardtop, mypy and a wheel build), ``tui``
(the app driven by Pilot, and its snapshots) and ``frameworks`` (training frameworks installed in
environments of their own and run as their users run them).  Each test is marked with its layer, so
``pytest -m "not engines"`` leaves out the slow processes and ``pytest`` runs every layer but
``frameworks``, which runs only when its directory is named: ``pytest tests/frameworks``.
"""

from __future__ import annotations

import asyncio
import gc
import inspect
import itertools
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

TESTS = Path(__file__).resolve().parent
LAYERS = ("unit", "engines", "tui", "frameworks")
QUICK = ("unit", "tui")
"""The layers `-m "not engines"` runs: no test of theirs starts a slow process."""
ON_REQUEST = ("frameworks",)
"""Layers that run only when the command names their directory: they install frameworks and take minutes."""

# pytest rewrites the asserts of every test module it imports, in every process of a run (three for the
# quick layers), and caches what it rewrote only where bytecode may be written.  Where
# ``PYTHONDONTWRITEBYTECODE`` is set, as on many CI machines, each process would rewrite them all again
# (1.5 to 2 s of CPU each).  The test modules are imported after this file.
sys.dont_write_bytecode = False

# The tests start `python`, `torchrun`, `deepspeed` and `shardtop` by name, as a user types them: the
# ones of the interpreter running the tests, also when its environment was not activated.
os.environ["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])


def pytest_sessionstart(session: pytest.Session) -> None:
    """Compile the package and the test helpers once, for every process the tests start.

    Where ``PYTHONDONTWRITEBYTECODE`` is set, as on many CI machines, no process caches what it
    compiles: each of the suite's hundreds of ``python``, ``shardtop`` and rank processes would
    compile shardtop again (about 0.2 s each).  ``compileall`` writes the caches all the same.
    """
    import compileall

    for folder in ("shardtop", "tests"):
        compileall.compile_dir(TESTS.parent / folder, quiet=1)


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem: pytest.Function) -> bool | None:
    """Run ``async def`` tests (Pilot needs an event loop; tests/tui and tests/engines) without an extra plugin."""
    if not inspect.iscoroutinefunction(pyfuncitem.obj):
        return None
    wanted = inspect.signature(pyfuncitem.obj).parameters
    asyncio.run(pyfuncitem.obj(**{name: pyfuncitem.funcargs[name] for name in wanted}))
    return True


WORKERS = 4
"""Processes for a run of the suite, where pytest-xdist is installed: one per group of the engines' layer
and one for the quick layers, on two cores.  The suite keeps two cores busy only that way: many engines
tests wait on processes that sleep, and a Pilot-driven test spends about a fifth of its time waiting for
the app to go idle."""
ENGINES_GROUP = "engines"
"""The engines' tests that train, plan and diagnose run in one of those processes, one after another, in
their order: their ranks take the cores themselves, and their module fixtures start many runs at once."""
REHEARSALS_GROUP = "engines-rehearsals"
"""Those of the modules in ``REHEARSALS`` run in a second: rehearsals, fits and the clients' plans, and,
to end about when the other two do, the main job's runs, the memory growth runs and the shard tables'
runs.  On 2026-12-07, two cores, the three groups took 463 s, 740 s and 808 s before these moved, and
654 s, 679 s and 733 s after (the suite: 13 min 33 s, then 12 min 18 s).  A fourth group for users' own
jobs, beside the quick layers, made it slower (13 min 48 s): four processes training at once on two
cores stretched every group."""
PROCESSES_GROUP = "engines-processes"
"""Those of the modules in ``PROCESSES`` run one after another in a third process: they start, signal,
stop and supervise runs, and read what those left, so they spend most of their time waiting on processes
that mostly wait themselves (a rank's step in most of them is a sleep).  With one process for the whole
layer the suite kept about one core of two busy.  The quick layers' tests share the fourth process (and
the others, once they are done)."""
REHEARSALS = frozenset({
    "test_rehearse_engines.py", "test_fit.py", "test_rehearse_cli.py", "test_rehearsal_patches.py",
    "test_rehearse_clients.py", "test_client_plans.py", "test_main_job.py", "test_memory_growth_runs.py",
    "test_shards.py",
})
PROCESSES = frozenset({
    "test_supervisor.py", "test_own_job.py", "test_own_job_rundir.py", "test_own_job_bootstrap.py",
    "test_own_job_hosts.py", "test_reliability.py", "test_stop_race.py", "test_launch.py", "test_cli.py",
    "test_tui_launch_stop.py", "test_tui_fit.py", "test_tui_rehearse.py", "test_quiet_screen.py",
    "test_first_frame_terminal.py", "test_prometheus_export.py", "test_stalls.py", "test_packaging.py",
    "test_launch_plan.py", "test_user_script.py", "test_steps_counted.py", "test_job_unchanged.py",
})


@pytest.hookimpl(tryfirst=True)
def pytest_cmdline_main(config: pytest.Config) -> None:
    """Run the suite on ``WORKERS`` processes: ``-m "not engines"`` answers in a minute or so on two
    cores, and the whole suite runs its quick layers beside the engines' layer instead of after it.

    Only where pytest-xdist is installed, the command names no ``-n`` (``-n 0``: one process), asks
    for tests of the quick layers, and updates no snapshot.
    """
    if getattr(config.option, "numprocesses", "no xdist") is not None or hasattr(config, "workerinput"):
        return
    if config.getoption("--snapshot-update", False) or config.option.collectonly or config.getoption("usepdb", False):
        return
    asked = {layer for layer in layers_asked(config) if layer_selected(config.option.markexpr, layer)}
    if not asked & set(QUICK):
        return
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    if cores > 1:
        config.option.numprocesses = min(WORKERS, 2 * cores)
        if config.option.dist == "no":
            # loadgroup keeps each group of the engines' tests together; worksteal lets a process that runs dry take
            # tests from a busy one (lengths vary tenfold)
            config.option.dist = "loadgroup" if "engines" in asked else "worksteal"


def layers_asked(config: pytest.Config) -> set[str]:
    """The layers the command's paths reach: every layer for none, or for the tests folder or one above."""
    by_default = set(LAYERS) - set(ON_REQUEST)
    found: set[str] = set()
    for arg in config.args or [str(TESTS)]:
        path = Path(config.invocation_params.dir, arg.split("::")[0]).resolve()
        if TESTS.is_relative_to(path):
            found.update(by_default)
        elif path.is_relative_to(TESTS):
            layer = path.relative_to(TESTS).parts[0]
            found.update((layer,) if layer in LAYERS else by_default)
    return found


QUICK_GC_THRESHOLD = (20_000, 10, 10)
"""The cyclic garbage collector's thresholds while a test of the quick layers runs (Python's: 700, 10, 10).

A Textual app makes objects by the hundred thousand (each line it draws is a ``Strip`` with seven
small caches), and Textual keeps the styles caches of the last 1024 widgets it drew in a
module-level cache.  With Python's thresholds, the full collections that follow took 24 of the 83
CPU-seconds of tests/tui in one process (74 of them, each walking about 700 000 objects); with
these, 2.4 s (3 of them) and 69 CPU-seconds in all, at a peak of 360 MB.  The engines' tests keep
Python's: some of them look for tensors kept alive across steps, in their own process."""
PYTHON_GC_THRESHOLD = gc.get_threshold()


def pytest_runtest_setup(item: pytest.Item) -> None:
    quick = all(item.get_closest_marker(layer) is None for layer in LAYERS if layer not in QUICK)
    gc.set_threshold(*(QUICK_GC_THRESHOLD if quick else PYTHON_GC_THRESHOLD))


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    """Leave a layer's directory unimported where ``-m`` deselects every test in it, or where the
    command did not name a layer that runs only on request.

    ``-m "not engines"`` would otherwise import every module of tests/engines (torch,
    DeepSpeed, transformers) only to deselect its tests: seconds of a run meant to be quick.
    """
    if collection_path.parent != TESTS or collection_path.name not in LAYERS:
        return None
    if collection_path.name in ON_REQUEST and collection_path.name not in layers_asked(config):
        return True
    return True if not layer_selected(config.option.markexpr, collection_path.name) else None


def layer_selected(markexpr: str, layer: str) -> bool:
    """Whether ``-m markexpr`` can select a test of ``layer``, whatever other marks the test carries.

    A test carries its own layer's mark and no other layer's; every other name in the expression
    is tried both ways.  An expression this cannot read selects everything (pytest then says why).
    """
    if not markexpr:
        return True
    try:
        from _pytest.mark.expression import Expression

        expression = Expression.compile(markexpr)
    except Exception:
        return True
    asked: set[str] = set()
    while True:  # every name the expression asks about, also those that short-circuiting hid at first
        known = set(asked)
        free = sorted(known - set(LAYERS))
        for values in itertools.product((False, True), repeat=len(free)):
            if expression.evaluate(_marks(layer, dict(zip(free, values, strict=True)), asked)):
                return True
        if asked == known:
            return False


def _marks(layer: str, given: dict[str, bool], asked: set[str]) -> Callable[..., bool]:
    """Whether a test of ``layer`` with the other marks ``given`` carries a mark; notes each name asked."""

    def marked(name: str, /, **_kwargs: object) -> bool:
        asked.add(name)
        return name == layer if name in LAYERS else given.get(name, False)

    return marked


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node: Any) -> None:
    """Tell each pytest-xdist process whether the tests go by group: it parses the command line again,
    which does not hold the ``--dist`` chosen above."""
    node.workerinput["loadgroup"] = node.config.option.dist == "loadgroup"


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist's, which reads the groups
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark every test with the layer of the directory it lives in; the engines' tests go to three processes."""
    grouped = config.pluginmanager.hasplugin("xdist")
    if getattr(config, "workerinput", {}).get("loadgroup"):
        config.option.loadgroup = True
    for item in items:
        try:
            layer = Path(item.path).resolve().relative_to(TESTS).parts[0]
        except ValueError:
            continue
        if layer in LAYERS:
            item.add_marker(getattr(pytest.mark, layer))
        if layer == "engines" and grouped:
            name = Path(item.path).name
            group = PROCESSES_GROUP if name in PROCESSES else REHEARSALS_GROUP if name in REHEARSALS else ENGINES_GROUP
            item.add_marker(pytest.mark.xdist_group(group))


@pytest.fixture
def runs_dir(tmp_path: Path) -> Path:
    return tmp_path / "runs"
