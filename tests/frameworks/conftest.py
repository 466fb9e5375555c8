"""The frameworks layer: each framework's environment, built once per session (and kept between sessions).

An environment that cannot be built fails the tests that need it, with pip's
own words: the layer installs what it needs, and says so when it cannot.
"""

from __future__ import annotations

import pytest

from tests.frameworks.environments import (
    AXOLOTL,
    LITGPT,
    TORCHTITAN,
    TORCHTUNE,
    TRL,
    Environment,
    Framework,
    InstallFailed,
    environment,
)


def _built(framework: Framework) -> Environment:
    try:
        return environment(framework)
    except InstallFailed as failed:
        pytest.fail(f"could not install {framework.name}'s environment: {failed}", pytrace=False)


@pytest.fixture(scope="session")
def trl_env() -> Environment:
    return _built(TRL)


@pytest.fixture(scope="session")
def torchtitan_env() -> Environment:
    return _built(TORCHTITAN)


@pytest.fixture(scope="session")
def litgpt_env() -> Environment:
    return _built(LITGPT)


@pytest.fixture(scope="session")
def torchtune_env() -> Environment:
    return _built(TORCHTUNE)


@pytest.fixture(scope="session")
def axolotl_env() -> Environment:
    return _built(AXOLOTL)
