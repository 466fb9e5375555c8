"""The engines layer: mypy starts with the session when the lint test is selected (tests/support/lint.py)."""

from __future__ import annotations

import pytest

from tests.support.lint import MypyRun, start_mypy

MYPY = pytest.StashKey[MypyRun]()
MYPY_TEST = "test_lint.py::test_mypy_strict_finds_no_error"


def pytest_collection_finish(session: pytest.Session) -> None:
    if any(item.nodeid.endswith(MYPY_TEST) for item in session.items):
        session.config.stash[MYPY] = start_mypy()


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
