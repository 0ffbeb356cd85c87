"""laned: owns a host's GPU inference lanes as systemd user units.

The package's layers are its folders, on floors, none importing from a floor above its own
(docs/architecture.md; tests/unit/test_architecture.py holds them): `config/`, `core/`,
`engines/`, `preflight/`, `validation/`, `render/`, `importer/` are pure; `adapters/` talk to
systemd, podman, NVML, journald, engines and files; `gates/` run the acceptance gates and the
bench against an engine; `owner/` is the one owner of lane state; `api/`, `cli/` and `daemon`
are the edges people use; `sim/` is the simulated engine.

The public surface, for code that uses laned as a library (imported on first use, so that
`python -m laned.sim` runs on a bare Python: the simulated engine's image has nothing else):

- the config: `load_config`, `parse_config`, `Config`, `LaneConfig`;
- rendering: `plan` (the files a config renders to) and `apply` (written atomically);
- the error tree: `LanedError` and its children, `Finding`, `Severity` (laned.errors).
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

_SURFACE = {
    "load_config": "laned.validation.load",
    "parse_config": "laned.validation.load",
    "Config": "laned.config.model",
    "LaneConfig": "laned.config.model",
    "plan": "laned.render.plan",
    "apply": "laned.adapters.rendered",
    "LanedError": "laned.errors",
    "ConfigError": "laned.errors",
    "Finding": "laned.errors",
    "Severity": "laned.errors",
}

__all__ = ["__version__", *_SURFACE]


def __getattr__(name: str) -> Any:
    if name in _SURFACE:
        return getattr(importlib.import_module(_SURFACE[name]), name)
    raise AttributeError(f"module 'laned' has no attribute {name!r}")
