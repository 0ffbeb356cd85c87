"""laned: owns a host's GPU inference lanes as systemd user units.

Public surface: the config model (`load_config`, `parse_config`, `Config`), rendering
(`laned.render.plan`), and the error tree (`LanedError` and its children). This module
imports nothing from third-party packages, so `python -m laned.sim` runs on a bare
Python (the simulated engine's container image has nothing else).
"""

from __future__ import annotations

__version__ = "0.1.0"

__all__ = ["__version__"]
