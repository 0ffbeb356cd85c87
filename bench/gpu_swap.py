#!/usr/bin/env python3
"""The GPU-memory gate inside a swap, on a real GPU (prints figures, writes JSON, asserts
nothing). For a GPU host without systemd (the `device` machine): needs torch, nvidia-ml-py
and httpx, and imports none of laned's other dependencies.

    python3 bench/gpu_swap.py [--gib 40] [--swaps 4] [--json OUT.json]

Two lanes' engines are the simulator holding GIB GiB of GPU 0 each (LANED_SIM_HOLD_GPU_GIB:
taken with torch when its weights start to load, held until the process ends). They are
swapped back and forth the way laned swaps a lane, with laned's own gate code:

1. stop: SIGTERM to the running engine, then wait until its process is gone (systemd's stop
   job ends there: the unit's processes have exited);
2. gate: `laned.owner.gpu_wait.wait_released` over NVML, as `gate.clear_for_start` runs it (threshold
   1 GiB, laned's default interval 0.25 s);
3. start: the other engine; then until NVML shows it holding its memory, and until it serves.

An observer thread reads NVML every 2 ms throughout, on its own, so each swap shows when the
old engine's memory was really released. The same swaps are then run without step 2 (what a
unit with Conflicts= does: the next start follows the stop job at once), to show whether the
new engine would have started while the old one's memory was still held.

What differs from laned on a systemd host: no systemd (the processes are started and stopped
here, as the unit's main process would be), no journald and no probes but one /health loop.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from laned.adapters.gpus import Nvml
from laned.core.facts import GIB
from laned.owner.gpu_wait import wait_released

LIMIT = 1.0 * GIB  # gpu_gate.max_used_gib's default
INTERVAL = 0.25  # gpu_gate.interval's default


class Observer(threading.Thread):
    """GPU 0's used memory (compute processes) every 2 ms: [(time, bytes, pids)]."""

    def __init__(self, nvml: Nvml) -> None:
        super().__init__(daemon=True)
        self.nvml, self.done = nvml, False
        self.samples: list[tuple[float, int, list[int]]] = []

    def run(self) -> None:
        while not self.done:
            reading = self.nvml.read([0])[0]
            pids = [pid for pid, _ in reading.processes or ()]
            self.samples.append((time.time(), reading.compute_bytes, pids))
            time.sleep(0.002)

    def released_after(self, since: float) -> float | None:
        """The first reading after `since` with the GPU's compute memory under LIMIT."""
        return next((at for at, used, _ in self.samples if at >= since and used <= LIMIT), None)

    def held_after(self, since: float, size: float) -> float | None:
        """The first reading after `since` with `size` bytes in use."""
        return next((at for at, used, _ in self.samples if at >= since and used >= size), None)

    def held_at(self, moment: float) -> int:
        """Bytes in use at the reading nearest before `moment`."""
        before = [used for at, used, _ in self.samples if at <= moment]
        return before[-1] if before else 0


LINGER = {"s": 0.0}


def engine(lane: str, port: int, gib: float) -> subprocess.Popen[bytes]:
    env = {**os.environ, "LANED_SIM_STARTUP": "1", "LANED_SIM_HOLD_GPU_GIB": f"{gib:g}",
           "LANED_SIM_GPU_LINGER": f"{LINGER['s']:g}"}  # fmt: skip
    return subprocess.Popen(
        [sys.executable, "-m", "laned.sim", "serve", f"/m/{lane}", "--port", str(port),
         "--served-model-name", lane, "--host", "127.0.0.1"],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip


def wait_serving(port: int, process: subprocess.Popen[bytes], timeout: float = 300) -> float:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"the engine on port {port} exited {process.returncode}")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                return time.time()
        except httpx.HTTPError:
            pass
        time.sleep(0.01)
    raise TimeoutError(f"port {port} never served")


def swap(
    nvml: Nvml,
    seen: Observer,
    old: subprocess.Popen[bytes],
    lane: str,
    port: int,
    gib: float,
    gate: bool,
) -> tuple[subprocess.Popen[bytes], dict[str, Any]]:
    t_stop = time.time()
    old.send_signal(signal.SIGTERM)
    old.wait(120)
    t_gone = time.time()
    result = None
    if gate:
        result = asyncio.run(wait_released(lambda: nvml.read([0]), LIMIT, 120, INTERVAL))
    t_open = time.time()
    held_at_start = seen.held_at(t_open)
    new = engine(lane, port, gib)
    t_started = time.time()
    failed = None
    try:
        t_ready = wait_serving(port, new)
    except RuntimeError:
        # It could not take its memory (CUDA out of memory): laned would restart it; here it
        # is started again once the old memory is gone, and the swap's figures end there.
        failed = new.returncode
        asyncio.run(wait_released(lambda: nvml.read([0]), LIMIT, 120, INTERVAL))
        new = engine(lane, port, gib)
        t_ready = wait_serving(port, new)
    released = seen.released_after(t_stop)
    t_held = seen.held_after(max(t_started, released or t_started), gib * GIB * 0.9)
    row = {
        "gate": gate,
        "stop_to_gone_s": t_gone - t_stop,
        "stop_to_released_s": None if released is None else released - t_stop,
        "stop_to_gate_open_s": t_open - t_stop if gate else None,
        "gate_polls": result.polls if result else None,
        "started_while_old_memory_held": released is not None and t_started < released,
        "old_memory_held_at_start_gib": held_at_start / GIB,
        "start_before_release_s": None if released is None else released - t_started,
        "stop_to_new_holding_s": None if t_held is None else t_held - t_stop,
        "stop_to_new_serving_s": t_ready - t_stop,
        "new_engine_failed_with": failed,
    }
    return new, row


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--gib", type=float, default=40.0)
    parser.add_argument("--swaps", type=int, default=4)
    parser.add_argument("--linger", type=float, default=0.0,
                        help="the memory outlives each engine's process this long (LANED_SIM_GPU_LINGER)")  # fmt: skip
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    LINGER["s"] = args.linger
    nvml, why = Nvml.open()
    if nvml is None:
        print(f"no NVML: {why}")
        return 1
    first = nvml.read([0])[0]
    seen = Observer(nvml)
    seen.start()
    ports = {"a": 18001, "b": 18002}
    running, lane = engine("a", ports["a"], args.gib), "a"
    wait_serving(ports["a"], running)
    rows = []
    for gate in (True, False):
        for _ in range(args.swaps):
            lane = "b" if lane == "a" else "a"
            running, row = swap(nvml, seen, running, lane, ports[lane], args.gib, gate)
            rows.append(row)
            print(json.dumps(row))
    running.send_signal(signal.SIGTERM)
    running.wait(120)
    seen.done = True
    seen.join()
    out = {
        "date": time.strftime("%Y-%m-%d"),
        "gpu": first.name,
        "total_gib": first.total_bytes / GIB,
        "gib_per_engine": args.gib,
        "gate_interval_s": INTERVAL,
        "linger_s": args.linger,
        "observer_readings": len(seen.samples),
        "swaps": rows,
    }
    for gate in (True, False):
        mine = [r for r in rows if r["gate"] is gate]
        print(
            f"{'with' if gate else 'without'} the gate: new engine started while the old one's "
            f"memory was held in {sum(r['started_while_old_memory_held'] for r in mine)} of {len(mine)} swaps; "
            f"it failed in {sum(r['new_engine_failed_with'] is not None for r in mine)}"
        )
    if args.json:
        args.json.write_text(json.dumps(out, indent=2) + "\n")
    nvml.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
