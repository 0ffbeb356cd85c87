"""Fixtures. Unit tests need nothing; integration tests bring up the real harness."""

from __future__ import annotations

import os
import sys

import pytest
from hypothesis import settings

from tests.helpers import ROOT

# No per-example deadline: a property holds or not whatever the machine's load (the unit tier
# runs while llama-server builds beside it, scripts/test); speed is bench/'s.
settings.register_profile("laned", deadline=None)
settings.load_profile("laned")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "/integration/" in str(item.fspath):
            item.add_marker(pytest.mark.integration)


@pytest.fixture(scope="session")
def python_exe() -> str:
    """The interpreter running the tests (it has laned installed)."""
    return sys.executable


@pytest.fixture(scope="session")
def repo_root() -> str:
    return str(ROOT)


@pytest.fixture
def clean_env(tmp_path: pytest.TempPathFactory) -> dict[str, str]:
    """An environment whose HOME and XDG dirs point into the test's tmp dir."""
    home = str(tmp_path)
    return {"HOME": home, "PATH": os.environ.get("PATH", "/usr/bin:/bin")}
