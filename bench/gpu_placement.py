#!/usr/bin/env python3
"""Placement and the GPU-memory gate on a real GPU (prints figures, writes JSON, asserts
nothing). Needs torch and nvidia-ml-py; runs laned.core.placement (what an activation takes
off) and the gate's wait (laned.owner.gpu_wait, over real NVML readings from
laned.adapters.gpus) without laned's other dependencies:

    python3 bench/gpu_placement.py [--gpu 0] [--json F]

Lanes are processes that hold what a vLLM lane would (its --gpu-memory-utilization × the
GPU's memory, their CUDA context included) until they are told to end, as an engine
does. On one GPU: `big` 0.45, `s1` and `s2` 0.2 each run together; `whole` 0.92 takes them
all off; back, the three start beside each other; `s4` 0.2 does not fit and takes off the
cheaper small lane only. Each start goes through the gate: the memory of the lanes taken off
released (by the driver, after their processes end), room for the lane beside those that
stay. Last, a lane with no room beside the staying ones: what the gate says after its
timeout.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from laned.adapters.gpus import Nvml
from laned.core.placement import Footprint, evictions
from laned.owner.gpu_wait import wait_released

HOLDER = """
import sys, time, torch
torch.cuda.set_device(int(sys.argv[2]))
torch.empty(1, device="cuda")  # the context first: it counts in the lane's share
free, total = torch.cuda.mem_get_info()
context = total - free - int(sys.argv[3])  # argv[3]: what the other processes hold
block = torch.empty(max(int(float(sys.argv[1]) * total) - context, 0), dtype=torch.uint8, device="cuda")
block.fill_(1)
torch.cuda.synchronize()
print("held", flush=True)
sys.stdin.read()  # until laned's stop: its stdin closes
"""

SHARES = {"big": 0.45, "s1": 0.2, "s2": 0.2, "whole": 0.92, "s4": 0.2, "late": 0.3}
COSTS = {"big": 300.0, "s1": 60.0, "s2": 120.0, "whole": 600.0, "s4": 60.0}  # seconds back in


class Lanes:
    """Lanes as holder processes on one GPU, placed and gated as laned does."""

    def __init__(self, nvml: Nvml, gpu: int) -> None:
        self.nvml, self.gpu = nvml, gpu
        self.total = nvml.read([gpu])[0].total_bytes
        self.totals = {gpu: self.total}
        self.before = nvml.read([gpu])[0].used_bytes  # what others hold (none, on a lent GPU)
        self.running: dict[str, subprocess.Popen[str]] = {}
        self.log: list[dict[str, Any]] = []

    def fp(self, lane: str) -> Footprint:
        return Footprint(lane, (self.gpu,), SHARES[lane], rule="share", port=hash(lane) % 60000)

    async def activate(self, lane: str, timeout: float = 60.0) -> dict[str, Any]:
        placed = [self.fp(n) for n in self.running]
        out = evictions(self.fp(lane), placed, self.totals, COSTS)
        t0 = time.monotonic()
        stopped = [self.running.pop(gone) for gone in out.lanes]
        for proc in stopped:  # a stop: the engine ends, the driver frees its memory
            assert proc.stdin is not None
            proc.stdin.close()
        staying = {p.pid: n for n, p in self.running.items()}
        need = self.fp(lane).demand(self.gpu, self.totals) or 0
        gate = await wait_released(
            lambda: self.nvml.read([self.gpu]),
            1.0 * 2**30 + self.before,
            timeout,
            0.05,
            staying=staying,
            room={self.gpu: need},
        )
        row: dict[str, Any] = {
            "lane": lane,
            "took_off": list(out.lanes),
            "why": dict(out.why),
            "beside": sorted(set(staying.values())),
            "gate_open": gate.released,
            "gate_waited_s": round(gate.waited, 3),
            "gate_polls": gate.polls,
            "still_held": gate.still_held,
        }
        for proc in stopped:
            proc.wait()
        if gate.released:
            t1 = time.monotonic()
            others = self.nvml.read([self.gpu])[0].used_bytes  # what the others hold now
            proc = subprocess.Popen(
                [sys.executable, "-c", HOLDER, str(SHARES[lane]), str(self.gpu), str(others)],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
            )  # fmt: skip
            assert proc.stdout is not None
            assert proc.stdout.readline().strip() == "held"
            self.running[lane] = proc
            row["start_s"] = round(time.monotonic() - t1, 3)
        reading = self.nvml.read([self.gpu])[0]
        row["used_gib_after"] = round(reading.used_bytes / 2**30, 2)
        names = {p.pid: n for n, p in self.running.items()}
        row["by_process_gib"] = {
            names.get(pid, str(pid)): round(b / 2**30, 2) for pid, b in reading.processes or ()
        }
        row["took_s"] = round(time.monotonic() - t0, 3)
        print(json.dumps(row), flush=True)
        self.log.append(row)
        return row

    def end(self) -> None:
        for proc in self.running.values():
            assert proc.stdin is not None
            proc.stdin.close()
            proc.wait()


async def scenario(gpu: int) -> dict[str, Any]:
    nvml, why = Nvml.open()
    if nvml is None:
        raise SystemExit(why)
    lanes = Lanes(nvml, gpu)
    reading = nvml.read([gpu])[0]
    try:
        for lane in ("big", "s1", "s2", "whole", "big", "s1", "s2", "s4"):
            await lanes.activate(lane)
        # No room beside the staying lanes (0.45 + 0.2 + 0.2 + 0.3 > 1) and, for the test, none
        # of them taken off: the gate waits out its timeout and says whose memory it waits for.
        placed = {n: lanes.fp(n) for n in lanes.running}
        late = lanes.fp("late")
        staying = {p.pid: n for n, p in lanes.running.items()}
        gate = await wait_released(
            lambda: nvml.read([gpu]), 2**30 + lanes.before, 2.0, 0.1, staying=staying,
            room={gpu: late.demand(gpu, lanes.totals) or 0},
        )  # fmt: skip
        lanes.log.append(
            {
                "lane": "late (no room, nothing taken off)",
                "placed": sorted(placed),
                "gate_open": gate.released,
                "gate_waited_s": round(gate.waited, 3),
                "still_held": gate.still_held,
            }
        )
        print(json.dumps(lanes.log[-1]), flush=True)
    finally:
        lanes.end()
        nvml.close()
    return {
        "gpu": reading.name,
        "gpu_total_gib": round(reading.total_bytes / 2**30, 2),
        "steps": lanes.log,
        "date": time.strftime("%Y-%m-%d"),
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--gpu", type=int, default=int(os.environ.get("GPU", "0")))
    parser.add_argument("--json")
    args = parser.parse_args()
    results = asyncio.run(scenario(args.gpu))
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
