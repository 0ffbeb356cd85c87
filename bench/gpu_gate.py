#!/usr/bin/env python3
"""The GPU-memory gate on a real GPU: does it see memory held, and how soon after the holder
stops does it see it released? Also the gate's own cost (one NVML reading).

A child process takes GIB GiB on GPU 0 with torch and writes to it; the gate (its verdict,
laned.core.gpu_memory, and its wait, laned.owner.gpu_wait, over laned.adapters.gpus: the code
laned runs) must see it held; the child is then stopped (SIGTERM, then SIGKILL in
other rounds) and the gate polls until the memory is released. Needs torch and
nvidia-ml-py; imports nothing else of laned's dependencies.

    python3 bench/gpu_gate.py [--gib 8] [--rounds 3] [--json OUT.json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from laned.adapters.gpus import Nvml
from laned.core.facts import GIB
from laned.core.gpu_memory import held
from laned.owner.gpu_wait import wait_released

HOLDER = """
import sys, time, torch
x = torch.empty(int(float(sys.argv[1]) * 2**30), dtype=torch.uint8, device="cuda:0")
x.fill_(1)
torch.cuda.synchronize()
print("held", flush=True)
time.sleep(3600)
"""


def ms(seconds: float) -> str:
    return f"{seconds * 1000:.1f} ms"


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--gib", type=float, default=8.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--limit-gib", type=float, default=1.0, help="the gate's max_used_gib")
    parser.add_argument("--json", help="write the figures here")
    args = parser.parse_args()

    nvml, why = Nvml.open()
    if nvml is None:
        print(f"no NVML: {why}")
        return 1
    first = nvml.read([0])[0]
    print(
        f"GPU 0: {first.name}, {first.total_bytes / GIB:.1f} GiB, used {first.used_bytes / GIB:.2f} GiB, "
        f"processes listed: {'no' if first.processes is None else len(first.processes)}"
    )
    limit = args.limit_gib * GIB
    results: dict[str, object] = {"gpu": first.name, "gib": args.gib, "limit_gib": args.limit_gib}

    # The gate's own cost: one reading of one GPU (NVML memory info + process list).
    reads = []
    for _ in range(200):
        t0 = time.perf_counter()
        nvml.read([0])
        reads.append(time.perf_counter() - t0)
    results["read_median_s"] = statistics.median(reads)
    results["read_p95_s"] = sorted(reads)[int(len(reads) * 0.95)]
    idle = asyncio.run(wait_released(lambda: nvml.read([0]), limit, 10, 0.01))
    results["gate_on_free_gpu_s"] = idle.waited
    print(f"one reading: median {ms(statistics.median(reads))}, p95 {ms(results['read_p95_s'])}")  # type: ignore[arg-type]
    print(f"gate on a free GPU: open after {ms(idle.waited)} ({idle.polls} reading)")

    rounds = []
    for i in range(args.rounds):
        sig = signal.SIGTERM if i % 2 == 0 else signal.SIGKILL
        child = subprocess.Popen(
            [sys.executable, "-c", HOLDER, str(args.gib)], stdout=subprocess.PIPE, text=True
        )
        assert child.stdout is not None
        if child.stdout.readline().strip() != "held":
            print("the holder did not start")
            return 1
        reading = nvml.read([0])[0]
        busy = held([reading], limit)
        assert busy, f"the gate does not see {args.gib} GiB held: {reading}"
        timed_out = asyncio.run(wait_released(lambda: nvml.read([0]), limit, 0.5, 0.05))
        assert not timed_out.released, "the gate opened while the memory was held"
        t0 = time.monotonic()
        os.kill(child.pid, sig)
        gate = asyncio.run(wait_released(lambda: nvml.read([0]), limit, 60, 0.005))
        opened = time.monotonic() - t0
        child.wait(timeout=60)
        exited = time.monotonic() - t0
        row = {
            "signal": sig.name,
            "held_gib": round(reading.compute_bytes / GIB, 2),
            "processes_listed": reading.processes is not None and len(reading.processes) > 0,
            "seen_held": busy[0],
            "released": gate.released,
            "release_s": opened,
            "polls": gate.polls,
            "child_reaped_s": exited,
        }
        rounds.append(row)
        print(
            f"round {i + 1} ({sig.name}): held {row['held_gib']} GiB ({busy[0]}); "
            f"gate open {ms(opened)} after the signal, {gate.polls} readings"
        )
    results["rounds"] = rounds
    for name in ("SIGTERM", "SIGKILL"):
        times = [r["release_s"] for r in rounds if r["signal"] == name]
        if times:
            results[f"release_{name.lower()}_median_s"] = statistics.median(times)  # type: ignore[type-var]
    nvml.close()
    print(json.dumps(results, indent=1, default=str))
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1, default=str) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
