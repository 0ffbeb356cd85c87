#!/usr/bin/env python3
"""A lane's sleep and wake on a real GPU, with laned's own steps around them (prints figures,
writes JSON, asserts nothing). For a GPU host without systemd (the `device` machine): needs
torch, nvidia-ml-py, httpx, prometheus_client, pydantic, dbus-fast and podman-py (the last
three only to import laned's owner and its wiring; neither D-Bus nor podman is reached).

    python3 bench/gpu_sleep.py [--gib 40] [--rounds 3] [--reload-gibps 8] [--json OUT.json]

1. The floor of a level-1 wake: GIB GiB on GPU 0 copied to pinned host memory and back
   with torch (each direction timed apart, and the pinning apart: vLLM's allocator pins
   a new host buffer at each sleep, vllm/device_allocator/cumem.py).
2. The simulator as a lane's engine holding GIB GiB of GPU 0 (LANED_SIM_HOLD_GPU_GIB), started
   with --enable-sleep-mode: at level 1 it really copies that memory to pinned host memory
   and back (laned/sim/gpu.py `offload`/`restore`), at level 2 it really gives it back and
   takes it again (the reload of the weights off disk is simulated at --reload-gibps).
   Each round, laned's own steps in the order the owner runs them: `actions.sleep_engine`
   (the sleep, /is_sleeping, NVML's per-process confirmation that the memory went down),
   then for the wake `gate.clear_for_start(waking=True)` (the GPU-memory gate, which
   knows the sleeper as its own), `actions.wake_engine` (/wake_up; level 2: reload_weights,
   /reset_prefix_cache), the readiness probes (/health, /v1/models) and
   `reactions.canary_check` (the canary against the answer kept at the first start).
   An observer thread reads NVML every 2 ms throughout, so each sleep and wake shows when
   the memory really went and came back.

What differs from laned on a systemd host: the engine is started here, not by a unit, so
the engine's processes are its own pid (systemd's cgroup gives laned that set); there is
no journald and no D-Bus.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from laned.adapters.gpus import Nvml
from laned.adapters.host import Host
from laned.adapters.probes import Probe
from laned.adapters.systemd import Systemd
from laned.config.model import LaneConfig
from laned.core.facts import GIB
from laned.core.lanes import Refused
from laned.core.recorder import Recorder
from laned.owner.actions import sleep_engine, wake_engine
from laned.owner.gate import clear_for_start
from laned.owner.reactions import canary_check
from laned.owner.wiring import host_seam
from laned.validation.load import parse_config

PORT = 18101


def floor(gib: float, rounds: int) -> dict[str, Any]:
    """Pinned host <-> GPU copies of `gib` GiB with torch: pinning, GPU -> host, host -> GPU."""
    import torch

    n = int(gib * GIB)
    block = torch.empty(n, dtype=torch.uint8, device="cuda:0")
    block.fill_(1)
    torch.cuda.synchronize()
    rows = []
    for _ in range(rounds):
        began = time.perf_counter()
        host = torch.empty(n, dtype=torch.uint8, pin_memory=True)
        pinned = time.perf_counter() - began
        began = time.perf_counter()
        host.copy_(block)
        torch.cuda.synchronize()
        down = time.perf_counter() - began
        began = time.perf_counter()
        block.copy_(host, non_blocking=True)
        torch.cuda.synchronize()
        up = time.perf_counter() - began
        rows.append({"pin_s": pinned, "gpu_to_host_s": down, "host_to_gpu_s": up})
        print(json.dumps(rows[-1]), flush=True)
        del host
    del block
    torch.cuda.empty_cache()
    up = statistics.median(r["host_to_gpu_s"] for r in rows)
    down = statistics.median(r["gpu_to_host_s"] for r in rows)
    pin = statistics.median(r["pin_s"] for r in rows)
    return {
        "gib": gib,
        "rounds": rows,
        "host_to_gpu_gibps": gib / up,
        "gpu_to_host_gibps": gib / down,
        "host_to_gpu_s_per_100gib": 100 * up / gib,
        "pin_s_per_gib": pin / gib,
    }


class Observer(threading.Thread):
    """GPU 0's used memory every 2 ms: [(time, device used bytes, processes)]."""

    def __init__(self, nvml: Nvml) -> None:
        super().__init__(daemon=True)
        self.nvml, self.done = nvml, False
        self.samples: list[tuple[float, int, Any]] = []

    def run(self) -> None:
        while not self.done:
            reading = self.nvml.read([0])[0]
            self.samples.append((time.monotonic(), reading.used_bytes, reading.processes))
            time.sleep(0.002)

    def first(self, since: float, test: Any) -> float | None:
        return next((at - since for at, used, _ in self.samples if at >= since and test(used)), None)  # fmt: skip


class BenchHost(Host):
    """laned's host adapter with the engine's pids given (systemd's cgroup has them on a host)."""

    def __init__(self, nvml: Nvml, pid: int) -> None:
        super().__init__(None, nvml)  # type: ignore[arg-type]  # an exec lane: podman unused
        self.pid = pid

    async def engine_pids(self, lane: str, spec: LaneConfig, control_group: str) -> set[int]:
        return {self.pid}


def lane_config(level: int, tmp: str) -> Any:
    text = (
        f'[daemon]\nstate_dir = "{tmp}/state"\n'
        f'[lanes.sleepy]\nunit = "laned-bench-sleepy.service"\nport = {PORT}\n'
        f'served_model_name = "sleepy"\nsleep_level = {level}\n'
        f'[lanes.sleepy.exec]\ncommand = ["{sys.executable}", "-m", "laned", "sim", "serve", "/m/sleepy"]\n'
    )
    return parse_config(text, "bench", {"HOME": tmp})


def mem_available_gib() -> float:
    """The host's MemAvailable (what laned's level-1 fit reads), GiB."""
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) / 2**20
    return float("nan")


ENGINE_LOG: dict[str, Any] = {"to": subprocess.DEVNULL}


def start_engine(gib: float, reload_gibps: float) -> subprocess.Popen[bytes]:
    env = {**os.environ, "LANED_SIM_STARTUP": "1", "LANED_SIM_HOLD_GPU_GIB": f"{gib:g}",
           "LANED_SIM_WEIGHTS_GIB": f"{gib:g}", "LANED_SIM_RELOAD_GIBPS": f"{reload_gibps:g}",
           "VLLM_SERVER_DEV_MODE": "1"}  # fmt: skip
    return subprocess.Popen(
        [sys.executable, "-m", "laned.sim", "serve", "/m/sleepy", "--port", str(PORT),
         "--served-model-name", "sleepy", "--host", "127.0.0.1", "--enable-sleep-mode"],
        env=env, stdout=ENGINE_LOG["to"], stderr=subprocess.STDOUT,
    )  # fmt: skip


async def serving(probe: Probe, engine: subprocess.Popen[bytes], timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while not (await probe.engine(PORT).healthy() and await probe.engine(PORT).listed()):
        if engine.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"the engine did not serve (exit {engine.poll()})")
        await asyncio.sleep(0.02)


def engine_wake_seconds() -> float:
    """The engine's own count of time spent in wakes (vllm:sleep_mode_operation_duration_seconds)."""
    text = httpx.get(f"http://127.0.0.1:{PORT}/metrics", timeout=5).text
    for line in text.splitlines():
        if line.startswith('vllm:sleep_mode_operation_duration_seconds_sum{operation="wake"'):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


async def rounds_at(level: int, gib: float, rounds: int, reload_gibps: float, nvml: Nvml) -> dict[str, Any]:  # fmt: skip
    notes: list[str] = []
    with tempfile.TemporaryDirectory() as tmp:
        config = lane_config(level, tmp)
        spec = config.lanes["sleepy"]
        engine = start_engine(gib, reload_gibps)
        probe, host = Probe(), BenchHost(nvml, engine.pid)
        seam = host_seam(Systemd(), probe, host)  # the owner's seam; its D-Bus side unused
        seen = Observer(nvml)
        seen.start()
        rows = []
        try:
            await serving(probe, engine)
            first, _ = await canary_check(seam, config, "sleepy", spec, "bench")
            notes.append(f"first canary: {first}")
            for _ in range(rounds):
                avail_awake = mem_available_gib()
                t0 = time.monotonic()
                asleep = await sleep_engine(seam, "sleepy", spec, SimpleNamespace(control_group=""), lambda _k, m: notes.append(m), level)  # type: ignore[arg-type]  # fmt: skip
                t1 = time.monotonic()
                if isinstance(asleep, Refused):
                    raise RuntimeError(asleep.reason)
                avail_asleep = mem_available_gib()
                woke_from = engine_wake_seconds()
                t2 = time.monotonic()
                gate = await clear_for_start(seam, "sleepy", spec, None, lambda _k, m: notes.append(m), Recorder(), waking=True, sleepers=asleep.pids)  # fmt: skip
                t3 = time.monotonic()
                refused = gate or await wake_engine(seam.engines, spec, level)
                t4 = time.monotonic()
                await serving(probe, engine)
                t5 = time.monotonic()
                outcome, detail = await canary_check(seam, config, "sleepy", spec, "bench")
                t6 = time.monotonic()
                engine_wake = engine_wake_seconds() - woke_from
                avail_woken = mem_available_gib()
                row = {
                    "sleep_s": t1 - t0,
                    "memory_gone_after_s": seen.first(t0, lambda used: used < gib * GIB / 2),
                    "residual_by_nvml_per_process_gib": {
                        i: b / GIB for i, b in asleep.residual.items()
                    },
                    "wake_to_canary_done_s": t6 - t2,
                    "gate_s": t3 - t2,
                    "wake_calls_s": t4 - t3,
                    "engine_wake_s": engine_wake,
                    "readiness_s": t5 - t4,
                    "canary_s": t6 - t5,
                    "canary": outcome.value if outcome else detail,
                    "laned_overhead_s": (t6 - t2) - engine_wake,
                    "memory_back_after_s": seen.first(t2, lambda used: used >= gib * GIB * 0.9),
                    "refused": refused.reason if refused else None,
                    "mem_available_gib": {
                        "awake": avail_awake,
                        "asleep": avail_asleep,
                        "woken": avail_woken,
                    },
                }
                rows.append(row)
                print(json.dumps(row), flush=True)
        finally:
            seen.done = True
            engine.terminate()
            engine.wait(60)
            await probe.close()
        processes = next((p for _, _, p in seen.samples if p), None)
    return {"level": level, "rounds": rows, "notes": notes[-6:], "nvml_processes_seen": repr(processes)}  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    parser.add_argument("--gib", type=float, default=40.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--reload-gibps", type=float, default=8.0)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--engine-log", type=Path)
    args = parser.parse_args()
    if args.engine_log:
        ENGINE_LOG["to"] = args.engine_log.open("ab")
    nvml, why = Nvml.open()
    if nvml is None:
        print(f"no NVML: {why}")
        return 1
    gpu = nvml.read([0])[0]
    out: dict[str, Any] = {"date": time.strftime("%Y-%m-%d"), "gpu": gpu.name,
                           "total_gib": gpu.total_bytes / GIB, "reload_gibps": args.reload_gibps}  # fmt: skip
    out["levels"] = [asyncio.run(rounds_at(level, args.gib, args.rounds, args.reload_gibps, nvml)) for level in (1, 2)]  # fmt: skip
    # The floor last: torch keeps the pinned buffer it frees cached in this process.
    out["floor"] = floor(args.gib, args.rounds)
    print(json.dumps({k: v for k, v in out["floor"].items() if k != "rounds"}), flush=True)
    for result in out["levels"]:
        rows = result["rounds"]
        med = {k: statistics.median(r[k] for r in rows) for k in ("sleep_s", "wake_to_canary_done_s", "engine_wake_s", "laned_overhead_s", "gate_s", "readiness_s", "canary_s")}  # fmt: skip
        print(f"level {result['level']}: " + ", ".join(f"{k} {v:.3f}" for k, v in med.items()))
        result["median"] = med
    if args.json:
        args.json.write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
