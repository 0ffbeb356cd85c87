"""The GPU-memory gate's wait: the lane's GPUs read, in a thread, until nothing of what went
is held (laned.core.gpu_memory.held: the verdict) or the gate's timeout passes.

Apart from the gate's sequence (laned.owner.gate) so that it imports asyncio and the pure
verdict alone: the GPU benches (bench/gpu_gate.py, gpu_swap.py, gpu_placement.py) run this
same code over NVML without laned's other dependencies.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Collection, Mapping

from laned.core.facts import GpuReading
from laned.core.gpu_memory import GateResult, held


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
    """Poll `read` (in a thread) until nothing is `held` (laned.core.gpu_memory) or
    `timeout` seconds have passed."""
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
