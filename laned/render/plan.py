"""What `laned render` puts on disk, as a pure plan of files: each path, its content, its mode,
and the manifest that lists them. laned.adapters.rendered writes the plan (atomically) and
compares it with the disk.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from enum import Enum

from laned.config.model import Config
from laned.config.names import (
    unit_path,
    weights_unit_name,
    weights_wrapper_path,
    wrapper_path,
)
from laned.render.units import lane_unit, weights_unit
from laned.render.wrapper import render_weights_wrapper, render_wrapper

MANIFEST = "generated.json"


@dataclass(frozen=True)
class GeneratedFile:
    """One file laned renders: where, what, and its mode."""

    path: str
    content: str
    mode: int


class Action(str, Enum):
    """What applying a plan did to one path."""

    CREATED = "created"
    UPDATED = "updated"
    UNCHANGED = "unchanged"
    REMOVED = "removed"


DEFAULT_SYSTEMD_VERSION = 252  # Debian 12; without RestartSteps= (see units.lane_unit)


def plan(config: Config, systemd_version: int = DEFAULT_SYSTEMD_VERSION) -> list[GeneratedFile]:
    """Every file the config renders to, for a user manager of `systemd_version`, in a stable order."""
    files: list[GeneratedFile] = []
    for lane in sorted(config.lanes):
        files.append(
            GeneratedFile(unit_path(config, lane), lane_unit(config, lane, systemd_version), 0o644)
        )
        files.append(GeneratedFile(wrapper_path(config, lane), render_wrapper(config, lane), 0o755))
        spec = config.lanes[lane]
        if spec.weight_cache is not None:
            path = f"{config.daemon.unit_dir}/{weights_unit_name(lane, spec)}"
            files.append(GeneratedFile(path, weights_unit(config, lane), 0o644))
            wrapper = render_weights_wrapper(config, lane)
            files.append(GeneratedFile(weights_wrapper_path(config, lane), wrapper, 0o755))
    return files


def lane_digest(config: Config, lane: str, systemd_version: int = DEFAULT_SYSTEMD_VERSION) -> str:
    """A short hash of everything rendered for one lane (its unit and wrapper): acceptance
    results are kept with it, so a result of another configuration shows as such."""
    mine = {unit_path(config, lane), wrapper_path(config, lane)}
    spec = config.lanes[lane]
    if spec.weight_cache is not None:
        mine |= {
            f"{config.daemon.unit_dir}/{weights_unit_name(lane, spec)}",
            weights_wrapper_path(config, lane),
        }
    digest = hashlib.sha256()
    for item in plan(config, systemd_version):
        if item.path in mine:
            digest.update(item.path.encode() + b"\0" + item.content.encode() + b"\0")
    return digest.hexdigest()[:16]


def manifest_path(config: Config) -> str:
    """Where laned lists the files it generated (so that it removes only its own)."""
    return f"{config.daemon.state_dir}/{MANIFEST}"


def manifest(files: list[GeneratedFile]) -> str:
    """The manifest's content: the paths laned generated (it removes only those, later)."""
    return json.dumps({"files": [f.path for f in files]}, indent=2) + "\n"


def listed(text: str | None) -> list[str]:
    """The paths a manifest's content lists ([] for none or a damaged one)."""
    if text is None:
        return []
    try:
        return [str(p) for p in json.loads(text).get("files", [])]
    except (ValueError, AttributeError):
        return []
