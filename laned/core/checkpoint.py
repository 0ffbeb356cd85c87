"""A checkpoint's identity as the file system has it: each weight and config file's path,
size, mtime and inode, read by stat alone (laned.adapters.pagecache.checkpoint), never by
reading the weights. Pure: the comparison, how a change is said, and the kept form.

Why laned keeps its own: vLLM 0.32's weight-cache fingerprint (vllm/model_executor/
model_loader/weight_cache/protocol.py `hash_checkpoint`) hashes each shard's safetensors
header only (names, dtypes, shapes, offsets), so a fine-tune copied over the same path keeps
the daemon's old weights; and a sleeping engine keeps what it read at its start (level 1 in
host RAM). TensorRT-LLM keys its weight cache by path, size and mtime_ns for the same reason;
laned adds the inode, which a copy to a temporary name and a rename changes even where the
size and a preserved mtime do not.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

SHOWN = 5  # files named in a change's event; the rest are counted


@dataclass(frozen=True, order=True)
class FileStat:
    """One file of a checkpoint, as stat(2) has it."""

    path: str
    size: int
    mtime_ns: int
    inode: int

    def to_json(self) -> list[Any]:
        """The kept form: [path, size, mtime_ns, inode]."""
        return [self.path, self.size, self.mtime_ns, self.inode]


Files = tuple[FileStat, ...]  # sorted by path


def changed(before: Files, now: Files) -> tuple[str, ...]:
    """The paths that differ, sorted: added, removed, or with another size, mtime or inode."""
    old = {f.path: f for f in before}
    new = {f.path: f for f in now}
    return tuple(sorted(p for p in old.keys() | new.keys() if old.get(p) != new.get(p)))


def said(model: str, paths: Sequence[str], shown: int = SHOWN) -> str:
    """The changed files, named relative to the model's directory: the first `shown` and a
    count of the rest (a checkpoint of hundreds of shards makes one line, not hundreds)."""
    prefix = model.rstrip("/") + "/"
    names = [p.removeprefix(prefix) for p in paths]
    listed = ", ".join(names[:shown])
    return listed + (f" and {len(names) - shown} more" if len(names) > shown else "")


def digest(files: Files) -> str:
    """A short hash of the files' identity (the canary's answer is kept per checkpoint)."""
    text = json.dumps([f.to_json() for f in files], separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def to_json(model: str, files: Files) -> dict[str, Any]:
    """The kept form of a checkpoint read at `model`."""
    return {"model": model, "files": [f.to_json() for f in files]}


def from_json(data: dict[str, Any] | None) -> tuple[str, Files] | None:
    """A kept checkpoint (its model and files); None where there is none or it is not one."""
    if data is None or not isinstance(data.get("model"), str):
        return None
    rows = data.get("files")
    if not isinstance(rows, list):
        return None
    files = []
    for row in rows:
        if not (isinstance(row, list) and len(row) == 4 and isinstance(row[0], str)):
            return None
        if not all(isinstance(v, int) and not isinstance(v, bool) for v in row[1:]):
            return None
        files.append(FileStat(row[0], row[1], row[2], row[3]))
    return data["model"], tuple(sorted(files))
