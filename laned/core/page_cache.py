"""The page cache as laned reads it, plain data: how much of some files is resident, and what
a read ahead did (laned.adapters.pagecache measures and reads; laned.owner.prefetching
decides when, docs/prefetch.md).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Residency:
    """How much of some files is in the page cache now."""

    resident_bytes: int
    total_bytes: int
    files: int

    @property
    def fraction(self) -> float:
        return self.resident_bytes / self.total_bytes if self.total_bytes else 0.0

    def to_json(self) -> dict[str, float | int]:
        return {
            "resident_bytes": self.resident_bytes,
            "total_bytes": self.total_bytes,
            "fraction": round(self.fraction, 4),
            "files": self.files,
        }


@dataclass(frozen=True)
class Prefetched:
    """What a prefetch did: bytes read, seconds, and why it ended."""

    read_bytes: int
    seconds: float
    ended: str  # "done", "stopped", "budget", "memory" (MemAvailable fell to the margin)
