"""What `laned render` puts on disk: a pure plan of files, then an atomic writer and a checker.

`plan()` is pure. `apply()` and `check()` touch the filesystem: writes are atomic
(temp file in the same directory + rename) and laned only ever removes files it
generated itself (listed in its manifest and still carrying its mark).
"""

from __future__ import annotations

import difflib
import hashlib
import json
import os
import stat
from dataclasses import dataclass
from enum import Enum

from laned.config.model import Config
from laned.config.names import unit_path, wrapper_path
from laned.errors import RenderError
from laned.render.files import write_atomic
from laned.render.units import GENERATED_MARK, lane_unit
from laned.render.wrapper import render_wrapper

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
    return files


def lane_digest(config: Config, lane: str, systemd_version: int = DEFAULT_SYSTEMD_VERSION) -> str:
    """A short hash of everything rendered for one lane (its unit and wrapper): acceptance
    results are kept with it, so a result of another configuration shows as such."""
    mine = {unit_path(config, lane), wrapper_path(config, lane)}
    digest = hashlib.sha256()
    for item in plan(config, systemd_version):
        if item.path in mine:
            digest.update(item.path.encode() + b"\0" + item.content.encode() + b"\0")
    return digest.hexdigest()[:16]


def manifest_path(config: Config) -> str:
    """Where laned lists the files it generated (so that it removes only its own)."""
    return f"{config.daemon.state_dir}/{MANIFEST}"


def _read(path: str) -> str | None:
    try:
        with open(path, encoding="utf-8") as handle:
            return handle.read()
    except (FileNotFoundError, NotADirectoryError):
        return None
    except (OSError, UnicodeDecodeError) as exc:
        raise RenderError(f"cannot read {path}: {exc}", "check its permissions") from exc


def _mode(path: str) -> int | None:
    try:
        return stat.S_IMODE(os.stat(path).st_mode)
    except FileNotFoundError:
        return None


def _previous(config: Config) -> list[str]:
    text = _read(manifest_path(config))
    if text is None:
        return []
    try:
        data = json.loads(text)
        return [str(p) for p in data.get("files", [])]
    except (ValueError, AttributeError):
        return []


def _is_ours(config: Config, path: str) -> bool:
    if path.startswith(f"{config.daemon.state_dir}/lanes/"):
        return True
    text = _read(path)
    return text is not None and GENERATED_MARK in text[:400]


def stale(config: Config, files: list[GeneratedFile]) -> list[str]:
    """Files laned generated earlier that the config no longer renders (lanes that left it)."""
    wanted = {f.path for f in files}
    return [
        p
        for p in _previous(config)
        if p not in wanted and os.path.exists(p) and _is_ours(config, p)
    ]


def apply(
    config: Config, systemd_version: int = DEFAULT_SYSTEMD_VERSION
) -> list[tuple[Action, str]]:
    """Write the plan, remove laned's files of lanes that left the config; report each path."""
    files = plan(config, systemd_version)
    changes: list[tuple[Action, str]] = []
    for item in files:
        current = _read(item.path)
        if current == item.content and _mode(item.path) == item.mode:
            changes.append((Action.UNCHANGED, item.path))
            continue
        write_atomic(item.path, item.content, item.mode)
        changes.append((Action.CREATED if current is None else Action.UPDATED, item.path))
    for path in stale(config, files):
        try:
            os.unlink(path)
        except OSError as exc:
            raise RenderError(f"cannot remove {path}: {exc.strerror}", "remove it by hand") from exc
        changes.append((Action.REMOVED, path))
    manifest = json.dumps({"files": [f.path for f in files]}, indent=2) + "\n"
    if _read(manifest_path(config)) != manifest:
        write_atomic(manifest_path(config), manifest, 0o644)
    return changes


def differences(config: Config, systemd_version: int = DEFAULT_SYSTEMD_VERSION) -> list[str]:
    """Differences between the plan and the disk, as unified diffs and notes; empty when in sync."""
    files = plan(config, systemd_version)
    out: list[str] = []
    for item in files:
        current = _read(item.path)
        if current is None:
            out.append(f"missing: {item.path}")
            continue
        if current != item.content:
            diff = difflib.unified_diff(
                current.splitlines(keepends=True),
                item.content.splitlines(keepends=True),
                fromfile=f"{item.path} (on disk)",
                tofile=f"{item.path} (rendered)",
            )
            out.append("".join(diff).rstrip("\n"))
        mode = _mode(item.path)
        if mode is not None and mode != item.mode:
            out.append(f"mode: {item.path} is {mode:04o}, expected {item.mode:04o}")
    out += [f"would remove: {p} (its lane left the config)" for p in stale(config, files)]
    return out
