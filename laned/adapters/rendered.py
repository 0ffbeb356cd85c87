"""laned's rendered files on disk (laned.render.plan is the pure plan): written atomically (a
temp file in the same directory and a rename), compared with the plan, and removed only when
laned generated them itself (listed in its manifest and still carrying its mark). Also the
one atomic writer of laned's other files (state, installed units).
"""

from __future__ import annotations

import difflib
import os
import stat
import tempfile

from laned.config.model import Config
from laned.errors import RenderError, WriteFailed
from laned.render.plan import (
    DEFAULT_SYSTEMD_VERSION,
    Action,
    GeneratedFile,
    listed,
    manifest,
    manifest_path,
    plan,
)
from laned.render.units import GENERATED_MARK


def write_atomic(path: str, content: str, mode: int) -> None:
    """Write `content` to `path` via a temp file in the same directory and a rename."""
    directory = os.path.dirname(path) or "."
    try:
        os.makedirs(directory, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=directory, prefix=".laned-", suffix=".tmp")
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as handle:
                handle.write(content)
                handle.flush()
                os.fsync(handle.fileno())
            os.chmod(tmp, mode)
            os.replace(tmp, path)
        except BaseException:
            if os.path.exists(tmp):
                os.unlink(tmp)
            raise
    except OSError as exc:
        raise WriteFailed(
            f"cannot write {path}: {exc.strerror}", f"check that {directory} is writable"
        ) from exc


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
    return listed(_read(manifest_path(config)))


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
    listing = manifest(files)
    if _read(manifest_path(config)) != listing:
        write_atomic(manifest_path(config), listing, 0o644)
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
