"""The real_llamacpp tier: laned against llama.cpp's real `llama-server`, built from source by
scripts/install-llamacpp, serving the suite's tiny model as GGUF. In CI the tier must run: a
missing build fails there; elsewhere it is one skip line that says how to get it."""

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
class RealLlamacpp:
    server: str  # the llama-server binary
    model: str  # the tiny model as a GGUF file


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "/llamacpp/" in str(item.fspath):
            item.add_marker(pytest.mark.real_llamacpp)


@pytest.fixture(scope="session")
def real_llamacpp() -> RealLlamacpp:
    server = os.environ.get("LANED_LLAMA_SERVER", str(ROOT / ".llamacpp" / "bin" / "llama-server"))
    model = os.environ.get("LANED_TINY_GGUF", str(ROOT / ".llamacpp" / "tiny.gguf"))
    if not os.access(server, os.X_OK) or not Path(model).is_file():
        why = (
            f"llama.cpp's llama-server is not built ({server}, {model}): scripts/install-llamacpp "
            "builds it and converts the tiny model (after scripts/install-vllm)"
        )
        if os.environ.get("CI"):
            pytest.fail(why)
        pytest.skip(why)
    return RealLlamacpp(server, model)
