"""The engines layer: mypy starts with the first engines test a process runs, when the lint test is
selected (tests/support/lint.py)."""

from __future__ import annotations

import pytest

from tests.support.lint import MypyRun, start_mypy

MYPY = pytest.StashKey[MypyRun]()
LOOKED = pytest.StashKey[bool]()
MYPY_TEST = "test_lint.py::test_mypy_strict_finds_no_error"


def pytest_runtest_setup(item: pytest.Item) -> None:
    """Start mypy beside this process's engines tests if one of them will ask for it.

    Not at collection: where pytest-xdist shares the suite out, every process collects every test,
    and only the one that runs the lint test's group of the engines' layer (tests/conftest.py) runs it.
    """
    config = item.config
    if config.stash.get(LOOKED, False):
        return
    config.stash[LOOKED] = True
    lint = [i for i in item.session.items if MYPY_TEST in i.nodeid]
    alone = not hasattr(config, "workerinput")  # one process runs every test
    if MYPY not in config.stash and lint and (alone or _group(lint[0]) == _group(item)):
        config.stash[MYPY] = start_mypy()


def _group(item: pytest.Item) -> object:
    """The pytest-xdist group a test goes to (None where the tests are not grouped)."""
    mark = item.get_closest_marker("xdist_group")
    return mark.args[0] if mark is not None and mark.args else None


def pytest_sessionfinish(session: pytest.Session) -> None:
    run = session.config.stash.get(MYPY, None)
    if run is not None:
        run.stop()


@pytest.fixture
def mypy_run(request: pytest.FixtureRequest) -> MypyRun:
    """The session's mypy run, or one started now (the test alone, or collected another way)."""
    run = request.config.stash.get(MYPY, None)
    if run is None:
        run = request.config.stash[MYPY] = start_mypy()
    return run
