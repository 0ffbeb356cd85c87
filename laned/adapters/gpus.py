"""The host's GPUs through NVML (nvidia-ml-py), and the GPU-memory gate.

`Nvml.open()` answers None, with the reason, where there is no driver (or no
nvidia-ml-py): callers then skip what needs GPUs, with a note, instead of failing.
Reads are plain values (`GpuReading`); `held()` is the gate's pure decision, and
`wait_released()` polls until it passes or the timeout runs out.

The gate exists because the next lane's engine must not start while the last one's
memory is still held: a stopped container can take seconds to release it (llama-swap
#97, vLLM #42017), and an engine that starts on a half-free GPU fails twenty minutes in.
This module imports only the standard library and pynvml, so bench/gpu_gate.py runs it
on a GPU machine without laned's other dependencies.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from typing import Any

from laned.preflight.facts import GIB, GpuReading


def held(
    readings: Sequence[GpuReading], max_used_bytes: float, sleepers: Collection[int] = ()
) -> list[str]:
    """The GPUs whose compute memory is over the limit, described; [] when the gate may open.
    `sleepers`: the processes of laned's own sleeping lanes, whose residual memory stays
    (counted only where NVML cannot list processes)."""
    out = []
    for gpu in readings:
        others = [(pid, used) for pid, used in gpu.processes or () if pid not in sleepers]
        used = sum(u for _, u in others) if gpu.processes else gpu.compute_bytes
        if used > max_used_bytes:
            who = (" by pid " + ", ".join(str(pid) for pid, _ in others)) if others else ""
            out.append(f"GPU {gpu.index} has {used / GIB:.2f} GiB in use{who}")
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
) -> GateResult:
    """Poll `read` (in a thread) until `held()` is empty or `timeout` seconds have passed."""
    started = clock()
    polls = 0
    while True:
        readings = await asyncio.to_thread(read)
        polls += 1
        busy = held(readings, max_used_bytes, sleepers)
        waited = clock() - started
        if not busy:
            return GateResult(True, waited, polls, [])
        if waited >= timeout:
            return GateResult(False, waited, polls, busy)
        await asyncio.sleep(min(interval, max(timeout - waited, 0)))
