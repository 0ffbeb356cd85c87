"""The host's GPUs through NVML (nvidia-ml-py).

`Nvml.open()` answers None, with the reason, where there is no driver (or no
nvidia-ml-py): callers then skip what needs GPUs, with a note, instead of failing.
Reads are plain values (`GpuReading`), judged elsewhere (laned.core.gpu_memory: the
GPU-memory gate's verdict, a sleep's confirmation). This module imports only the standard
library, pynvml and those plain values, so a bench reads NVML with it on a GPU machine
without laned's other dependencies. `SimGpus` stands in for NVML on a
simulated host (LANED_SIM_GPUS).
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Sequence
from typing import Any

from laned.core.facts import GpuReading


class Nvml:
    """An initialised NVML; `open()` it, `read()` GPUs, `close()` when done."""

    def __init__(self, module: Any) -> None:
        self.nvml = module

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
        """How many GPUs NVML sees."""
        return int(self.nvml.nvmlDeviceGetCount())

    def read(self, indices: Sequence[int] | None = None) -> list[GpuReading]:
        """Memory of the given GPUs (all when None); indices that do not exist are skipped."""
        n = self.nvml
        wanted = (
            range(self.count()) if indices is None else [i for i in indices if i < self.count()]
        )
        out = []
        for index in wanted:
            handle = n.nvmlDeviceGetHandleByIndex(index)
            name = n.nvmlDeviceGetName(handle)
            try:
                # v2 counts the driver's reserved memory apart, so `used` is what was allocated.
                memory = n.nvmlDeviceGetMemoryInfo(handle, version=n.nvmlMemory_v2)
            except (n.NVMLError, AttributeError, TypeError):
                memory = n.nvmlDeviceGetMemoryInfo(handle)
            processes: tuple[tuple[int, int], ...] | None
            try:
                listed = n.nvmlDeviceGetComputeRunningProcesses(handle)
                processes = tuple((int(p.pid), int(p.usedGpuMemory or 0)) for p in listed)
            except n.NVMLError:
                processes = None
            out.append(
                GpuReading(
                    index,
                    name.decode() if isinstance(name, bytes) else str(name),
                    int(memory.total),
                    int(memory.used),
                    processes,
                )
            )
        return out


class SimGpus:
    """The GPUs of a simulated host (LANED_SIM_GPUS=DIR, docs/simulator.md), read as NVML
    would read them: DIR/gpus.json lists the GPUs (`{"gpus": [{"name", "total_bytes"}]}`,
    indexed by position), each simulated engine writes what its process holds on which GPU
    to DIR/held/PID.json (laned/sim/gpu.py), and a process that has ended holds nothing (the
    driver's rule). What placement and the gate read on a four-GPU host with no GPU."""

    def __init__(self, root: str) -> None:
        self.root = root

    def close(self) -> None:
        """Nothing to shut down."""

    def _gpus(self) -> list[dict[str, Any]]:
        with open(os.path.join(self.root, "gpus.json")) as f:
            return list(json.load(f)["gpus"])

    def count(self) -> int:
        """How many GPUs the simulated host has."""
        return len(self._gpus())

    def read(self, indices: Sequence[int] | None = None) -> list[GpuReading]:
        """Memory of the given GPUs (all when None), by the processes alive that hold it."""
        gpus = self._gpus()
        held: dict[int, list[tuple[int, int]]] = {i: [] for i in range(len(gpus))}
        folder = os.path.join(self.root, "held")
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
        wanted = range(len(gpus)) if indices is None else [i for i in indices if i < len(gpus)]
        return [
            GpuReading(
                i,
                str(gpus[i].get("name", "simulated GPU")),
                int(gpus[i]["total_bytes"]),
                sum(used for _, used in held[i]),
                tuple(held[i]),
            )
            for i in wanted
        ]
