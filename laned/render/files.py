"""Writing laned's files (units, wrappers, state) atomically: a temp file and a rename."""

from __future__ import annotations

import os
import tempfile

from laned.errors import WriteFailed


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
