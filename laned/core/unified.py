"""Unified memory (DGX Spark's GB10 and kin): a GPU with no memory of its own, which shares
one pool with the host. Pure: what the host says of its memory in, the pool and the GPU's
reading out (docs/placement.md, "Unified memory").

How laned decides a GPU is unified (laned.adapters.gpus): NVML answers its memory with
NVML_ERROR_NOT_SUPPORTED (v2 and v1), as on a GB10, while it still lists the device's compute
processes with what each holds (leptonai/gpud #1170, Syllo/nvtop #411, XuehaiPan/nvitop #208
saw the same on driver 580). A device that refuses both is not read at all. The pool is read
from the host: /proc/meminfo's MemTotal and MemAvailable, and, where laned's cgroup (or one
above it) has a memory.max, that limit less the cgroup's memory.current: an engine that
outgrows either takes the host (or laned's slice of it) down.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from laned.core.facts import GpuReading

KIB = 1024


@dataclass(frozen=True)
class Pool:
    """The memory a unified GPU shares with the host: its size and what is available now
    (bytes), and whether a cgroup's limit is what bounds it."""

    total_bytes: int
    available_bytes: int
    limited: bool = False

    @property
    def used_bytes(self) -> int:
        """What is taken of it, by every process of the host (GPU or not)."""
        return max(self.total_bytes - self.available_bytes, 0)


def parse_meminfo(text: str) -> dict[str, int]:
    """/proc/meminfo's lines (`MemTotal:  127600748 kB`) as bytes by key."""
    out: dict[str, int] = {}
    for line in text.splitlines():
        key, _, rest = line.partition(":")
        parts = rest.split()
        if parts and parts[0].isdigit():
            out[key.strip()] = int(parts[0]) * (KIB if parts[1:] == ["kB"] else 1)
    return out


def pool_of(
    meminfo: Mapping[str, int], cgroups: Iterable[tuple[int, int]] = (), taken: int = 0
) -> Pool | None:
    """The pool from meminfo (bytes by key; MemTotal and MemAvailable needed, else None) and
    the (memory.max, memory.current) of each cgroup from laned's up to the root that has a
    limit: the pool is the smallest of MemTotal and the limits, available the smallest of
    MemAvailable and each limit less its usage. `taken`: what is gone from MemAvailable that
    the meminfo read does not show (a simulated host's engines, laned.adapters.gpus)."""
    total, available = meminfo.get("MemTotal"), meminfo.get("MemAvailable")
    if total is None or available is None:
        return None
    available -= taken
    limited = False
    for limit, current in cgroups:
        if limit < total:
            total, limited = limit, True
        if limit - current < available:
            available, limited = limit - current, True
    return Pool(total, max(min(available, total), 0), limited)


def unified_reading(
    index: int, name: str, pool: Pool, processes: tuple[tuple[int, int], ...] | None
) -> GpuReading:
    """A unified GPU read as laned reads any GPU: the pool as its memory (free = available),
    the processes NVML lists on it."""
    return GpuReading(index, name, pool.total_bytes, pool.used_bytes, processes, unified=True)


def pool_available(readings: Iterable[GpuReading]) -> int | None:
    """What is available of the pool that the unified GPUs among `readings` share (the
    least any reading says); None where none is unified."""
    free = [g.total_bytes - g.used_bytes for g in readings if g.unified]
    return min(free) if free else None
