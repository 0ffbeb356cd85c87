"""The host's GPUs through NVML (nvidia-ml-py).

`Nvml.open()` answers None, with the reason, where there is no driver (or no
nvidia-ml-py): callers then skip what needs GPUs, with a note, instead of failing.
Reads are plain values (`GpuReading`), judged elsewhere (laned.core.gpu_memory: the
GPU-memory gate's verdict, a sleep's confirmation). This module imports only the standard
library, pynvml and those plain values, so a bench reads NVML with it on a GPU machine
without laned's other dependencies. `SimGpus` stands in for NVML on a
simulated host (LANED_SIM_GPUS): the same reading over a module that answers as pynvml does.

No NVML call ends a read with NVML's error: a GPU NVML cannot count, find or read is left
out with the reason (`survey`, shown in /fit's gpu_note); a name it cannot read is the
index's; processes it cannot list are None (the gate then counts the device's memory). A
GPU whose memory NVML answers "Not Supported" while it lists the GPU's processes is a
unified-memory GPU (DGX Spark's GB10; laned.core.unified): read as the pool it shares
with the host.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Callable, Sequence
from types import SimpleNamespace
from typing import Any

from laned.adapters.kernel import cgroup_memory
from laned.core.facts import GpuReading
from laned.core.unified import Pool, parse_meminfo, pool_of, unified_reading


def host_pool() -> Pool | None:
    """The host's memory as a unified GPU shares it: /proc/meminfo and laned's cgroups."""
    try:
        with open("/proc/meminfo", encoding="ascii") as handle:
            text = handle.read()
    except OSError:
        return None
    return pool_of(parse_meminfo(text), cgroup_memory())


class Nvml:
    """An initialised NVML; `open()` it, `read()` GPUs, `close()` when done. `pool`: the
    memory a unified GPU shares with the host (laned.core.unified), read when one is."""

    def __init__(self, module: Any, pool: Callable[[], Pool | None] = host_pool) -> None:
        self.nvml = module
        self.pool = pool

    @classmethod
    def open(cls) -> tuple[Nvml | None, str]:
        """NVML, or None and why it is not there (no nvidia-ml-py, no driver)."""
        try:
            import pynvml
        except ImportError:
            return None, "nvidia-ml-py is not installed"
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as exc:
            return None, f"NVML is not available ({exc}): no NVIDIA driver on this host"
        return cls(pynvml), ""

    def close(self) -> None:
        """Shut NVML down."""
        with contextlib.suppress(self.nvml.NVMLError):
            self.nvml.nvmlShutdown()

    def count(self) -> int:
        """How many GPUs NVML sees (0 where it cannot count them)."""
        counted = self._count()
        return 0 if isinstance(counted, str) else counted

    def _count(self) -> int | str:
        try:
            return int(self.nvml.nvmlDeviceGetCount())
        except self.nvml.NVMLError as exc:
            return f"NVML cannot count the GPUs ({exc})"

    def read(self, indices: Sequence[int] | None = None) -> list[GpuReading]:
        """Memory of the given GPUs (all when None); indices that do not exist are skipped,
        and those NVML cannot read (`survey` says why)."""
        return self.survey(indices)[0]

    def survey(self, indices: Sequence[int] | None = None) -> tuple[list[GpuReading], list[str]]:
        """The readings of the given GPUs (all when None), and why each one left out was."""
        count = self._count()
        if isinstance(count, str):
            return [], [count]
        wanted = range(count) if indices is None else [i for i in indices if i < count]
        out, skipped = [], []
        for index in wanted:
            reading = self._read_one(index)
            if isinstance(reading, str):
                skipped.append(f"GPU {index}: {reading}")
            else:
                out.append(reading)
        return out, skipped

    def _read_one(self, index: int) -> GpuReading | str:
        """One GPU's reading, or why it cannot be read."""
        n = self.nvml
        try:
            handle = n.nvmlDeviceGetHandleByIndex(index)
        except n.NVMLError as exc:
            return f"NVML cannot find it ({exc})"
        try:
            raw = n.nvmlDeviceGetName(handle)
            name = raw.decode() if isinstance(raw, bytes) else str(raw)
        except n.NVMLError:
            name = f"GPU {index}"
        processes: tuple[tuple[int, int], ...] | None
        try:
            listed = n.nvmlDeviceGetComputeRunningProcesses(handle)
            processes = tuple((int(p.pid), int(p.usedGpuMemory or 0)) for p in listed)
        except n.NVMLError:
            processes = None
        try:
            memory = _memory_info(n, handle)
        except n.NVMLError_NotSupported as exc:
            # A GB10's answer: no memory of its own. It lists its processes all the same.
            if processes is None:
                return f"NVML reads neither its memory nor its processes ({exc})"
            pool = self.pool()
            if pool is None:
                return "a unified-memory GPU (its memory is the host's), and the host's memory cannot be read"
            return unified_reading(index, name, pool, processes)
        except n.NVMLError as exc:
            return f"NVML cannot read its memory ({exc})"
        return GpuReading(index, name, int(memory.total), int(memory.used), processes)


def _memory_info(n: Any, handle: Any) -> Any:
    """nvmlDeviceGetMemoryInfo: v2 where the driver has it (it counts the driver's reserved
    memory apart, so `used` is what was allocated), else v1."""
    try:
        return n.nvmlDeviceGetMemoryInfo(handle, version=n.nvmlMemory_v2)
    except (n.NVMLError, AttributeError, TypeError):
        return n.nvmlDeviceGetMemoryInfo(handle)  # a GB10 refuses v1 too: NotSupported


class _NVMLError(Exception):
    """pynvml.NVMLError, as a simulated host's NVML raises it (not one of laned's errors:
    the adapter maps it, as it maps pynvml's)."""


class _NotSupported(_NVMLError):
    """pynvml.NVMLError_NotSupported: a GB10's answer to a memory read."""


class SimNvml:
    """A simulated host's NVML (LANED_SIM_GPUS=DIR, docs/simulator.md), answering as pynvml
    does: DIR/gpus.json lists the GPUs (`{"gpus": [{"name", "total_bytes", "unified"}]}`,
    indexed by position), each simulated engine writes what its process holds on which GPU
    to DIR/held/PID.json (laned/sim/gpu.py), and a process that has ended holds nothing (the
    driver's rule). A GPU marked `"unified": true` answers as a GB10's NVML does: its memory
    "Not Supported", its processes listed; its pool is DIR/meminfo (`sim_pool`)."""

    NVMLError = _NVMLError
    NVMLError_NotSupported = _NotSupported
    nvmlMemory_v2 = 0x02000028

    def __init__(self, root: str) -> None:
        self.root = root

    def gpus(self) -> list[dict[str, Any]]:
        """DIR/gpus.json's GPUs."""
        with open(os.path.join(self.root, "gpus.json")) as f:
            return list(json.load(f)["gpus"])

    def nvmlShutdown(self) -> None:
        """Nothing to shut down."""

    def nvmlDeviceGetCount(self) -> int:
        """How many GPUs the simulated host has."""
        return len(self.gpus())

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:
        """A GPU's handle: its index."""
        return index

    def nvmlDeviceGetName(self, handle: int) -> str:
        """Its name in gpus.json."""
        return str(self.gpus()[handle].get("name", "simulated GPU"))

    def nvmlDeviceGetMemoryInfo(self, handle: int, version: int = 0) -> SimpleNamespace:
        """Its memory: what the live processes hold; "Not Supported" on a unified GPU."""
        gpu = self.gpus()[handle]
        if gpu.get("unified"):
            raise self.NVMLError_NotSupported("Not Supported")
        used = sum(b for _, b in sim_held(self.root).get(handle, ()))
        total = int(gpu["total_bytes"])
        return SimpleNamespace(total=total, used=used, free=total - used)

    def nvmlDeviceGetComputeRunningProcesses(self, handle: int) -> list[SimpleNamespace]:
        """The live processes that hold memory on it."""
        return [
            SimpleNamespace(pid=pid, usedGpuMemory=used)
            for pid, used in sim_held(self.root).get(handle, ())
        ]


def sim_held(root: str) -> dict[int, list[tuple[int, int]]]:
    """What each live simulated process holds, by GPU index: [(pid, bytes)]."""
    held: dict[int, list[tuple[int, int]]] = {}
    folder = os.path.join(root, "held")
    for name in sorted(os.listdir(folder)) if os.path.isdir(folder) else ():
        try:
            with open(os.path.join(folder, name)) as f:
                record = json.load(f)
            os.kill(int(record["pid"]), 0)
        except ProcessLookupError:
            continue  # ended: its memory is free
        except (OSError, ValueError, KeyError):
            continue  # being written, or not one of ours
        for index, used in record["gpus"].items():
            held.setdefault(int(index), []).append((int(record["pid"]), int(used)))
    return held


def sim_pool(root: str) -> Pool | None:
    """A simulated host's memory pool: DIR/meminfo (as /proc/meminfo is written; the host
    with no engine running, so that a test sets it), less what the live simulated processes
    hold on its unified GPUs (they take it from the one pool)."""
    try:
        with open(os.path.join(root, "meminfo"), encoding="ascii") as handle:
            text = handle.read()
        with open(os.path.join(root, "gpus.json")) as f:
            unified = {i for i, g in enumerate(json.load(f)["gpus"]) if g.get("unified")}
    except (OSError, ValueError, KeyError):
        return None
    held = sim_held(root)
    taken = sum(b for index in unified for _, b in held.get(index, ()))
    return pool_of(parse_meminfo(text), (), taken)


class SimGpus(Nvml):
    """The GPUs of a simulated host (SimNvml), read as NVML is read: what placement and the
    gate read on a four-GPU host with no GPU, or on a GB10 with no GB10."""

    def __init__(self, root: str) -> None:
        super().__init__(SimNvml(root), lambda: sim_pool(root))
        self.root = root
