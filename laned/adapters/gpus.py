"""The host's GPUs through NVML (nvidia-ml-py), and the GPU-memory gate.

`Nvml.open()` answers None, with the reason, where there is no driver (or no
nvidia-ml-py): callers then skip what needs GPUs, with a note, instead of failing.
Reads are plain values (`GpuReading`); `held()` is the gate's pure decision, and
`wait_released()` polls until it passes or the timeout runs out.

The gate exists because the next lane's engine must not start while the last one's
memory is still held: a stopped container can take seconds to release it (llama-swap
#97, vLLM #42017), and an engine that starts on a half-free GPU fails twenty minutes in.
This module imports only the standard library and pynvml, so bench/gpu_gate.py runs it
on a GPU machine without laned's other dependencies. `SimGpus` stands in for NVML on a
simulated host (LANED_SIM_GPUS).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from laned.core.facts import GIB, GpuReading


def held(
    readings: Sequence[GpuReading],
    max_used_bytes: float,
    sleepers: Collection[int] = (),
    staying: Mapping[int, str] = {},
    room: Mapping[int, int] = {},
) -> list[str]:
    """The GPUs the lane may not start on yet, described; [] when the gate may open.

    On each GPU, the memory of processes other than `sleepers` (laned's sleeping lanes,
    whose residual memory stays) and `staying` (pid -> lane: the lanes that run on beside
    this one) must be down to `max_used_bytes`: the lanes taken off have let go. Where
    `room` names a GPU, its free memory must also cover what the lane takes there (its
    footprint, laned.core.placement), counting what the staying lanes hold."""
    out = []
    for gpu in readings:
        mine = [(pid, used) for pid, used in gpu.processes or () if pid in staying]
        others = [
            (pid, used)
            for pid, used in gpu.processes or ()
            if pid not in sleepers and pid not in staying
        ]
        if gpu.processes:
            used = sum(u for _, u in others)
        else:  # NVML lists no process: the device's count, unless lanes stay on it
            used = 0 if room.get(gpu.index) and staying else gpu.compute_bytes
        if used > max_used_bytes:
            who = (" by pid " + ", ".join(str(pid) for pid, _ in others)) if others else ""
            out.append(f"GPU {gpu.index} has {used / GIB:.2f} GiB in use{who}")
            continue
        need = room.get(gpu.index)
        free = gpu.total_bytes - gpu.used_bytes
        if need and free < need:
            holders = ", ".join(
                f"lane {staying[pid]} {used / GIB:.1f} GiB (pid {pid})" for pid, used in mine
            )
            out.append(
                f"GPU {gpu.index} has {free / GIB:.1f} GiB free, the lane takes {need / GIB:.1f} GiB"
                + (f"; held by {holders}" if holders else "")
            )
    return out


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


@dataclass(frozen=True)
class GateResult:
    """How the gate ended: released (True) or timed out, after `waited` seconds and `polls` reads."""

    released: bool
    waited: float
    polls: int
    still_held: list[str]


async def wait_released(
    read: Callable[[], list[GpuReading]],
    max_used_bytes: float,
    timeout: float,
    interval: float,
    clock: Callable[[], float] = time.monotonic,
    sleepers: Collection[int] = (),
    staying: Mapping[int, str] = {},
    room: Mapping[int, int] = {},
) -> GateResult:
    """Poll `read` (in a thread) until `held()` is empty or `timeout` seconds have passed."""
    started = clock()
    polls = 0
    while True:
        readings = await asyncio.to_thread(read)
        polls += 1
        busy = held(readings, max_used_bytes, sleepers, staying, room)
        waited = clock() - started
        if not busy:
            return GateResult(True, waited, polls, [])
        if waited >= timeout:
            return GateResult(False, waited, polls, busy)
        await asyncio.sleep(min(interval, max(timeout - waited, 0)))
