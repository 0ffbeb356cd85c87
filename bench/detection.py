#!/usr/bin/env python3
"""How fast laned notices an engine's death, and a stall (prints figures, writes JSON,
asserts nothing):

    scripts/harness up && .venv/bin/python bench/detection.py [--injections 50] [--json F]

- exits: the simulator's fault endpoint makes the engine exit with status 0 (how vLLM's API
  server ends when its engine dies), status 1, or by SIGKILL; each injection is timed from
  the fault's answer to laned's `restarting` event, and to laned_engine_exits_total counting
  it. The lane comes back (restart_sec 100 ms) before the next injection.
- stall: the engine keeps answering /health and stops producing tokens while requests wait
  (vLLM #39863); timed from the stall to laned's `restarting` event, against the configured
  window (probe.stall_after).
- engine dead: vLLM's own death as the simulator plays it (vllm/entrypoints/serve/
  instrumentator/health.py, launchers/launcher.py): its core dies, /health answers 503 at once
  and the API server exits 0 at its watchdog's next look (every 5 s); on a lane of its own with
  laned's default probing (every 5 s, 3 failures), timed from the fault's answer to the lane
  leaving `ready` (the dark time before its restart begins), `--dead` times.
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
import time
import uuid
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import free_port, harness_env, pct, sim_lane, supervisor_on
from laned.api.metrics import LanedMetrics
from laned.core.lanes import LaneState
from laned.owner.supervisor import Supervisor

FAULTS = {
    "exit 0": {"kind": "exit", "code": 0},
    "exit 1": {"kind": "exit", "code": 1},
    "SIGKILL": {"kind": "crash", "signal": 9},
}
STALL_AFTER = 2.0  # seconds: probe.stall_after in the bench's lane


def exits_counted(metrics: LanedMetrics) -> float:
    return sum(
        sample.value
        for family in metrics.exits.collect()
        for sample in family.samples
        if sample.name.endswith("_total")
    )


async def until(predicate: Any, timeout: float = 60) -> float:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if predicate():
            return time.time()
        await asyncio.sleep(0.001)
    raise TimeoutError("the condition never held")


def restarted_since(sup: Supervisor, since: float) -> bool:
    return any(
        e.lane == "a" and e.to_state is LaneState.RESTARTING and e.at >= since for e in sup.events
    )


def left_ready_since(sup: Supervisor, since: float) -> bool:
    return any(
        e.lane == "a" and e.from_state is LaneState.READY and e.to_state is not LaneState.READY
        and e.at >= since
        for e in sup.events
    )  # fmt: skip


async def engine_dead(injections: int) -> dict[str, Any]:
    """vLLM's death (503, then exit 0 within 5 s) on a lane probed as laned probes by default:
    from the fault to the lane leaving `ready`."""
    env = harness_env()
    tag = f"benchdead{uuid.uuid4().hex[:6]}"
    unit_dir = Path(env["XDG_CONFIG_HOME"]) / "systemd" / "user"
    port = free_port()
    with tempfile.TemporaryDirectory() as tmp:
        text = (
            f'[daemon]\nunit_dir = "{unit_dir}"\nbin_dir = "{tmp}/bin"\nstate_dir = "{tmp}/state"\n'
            'listen = "127.0.0.1:1"\n'
            + sim_lane(
                "a", f"{tag}-a.service", port,
                'restart_sec = "100ms"\nstart_limit_burst = 100000\n'
                'probe = { start_interval_min = "50ms", start_interval_max = "200ms" }\n',
            )
        )  # fmt: skip
        sup = supervisor_on(text, tmp, env)
        await sup.start()
        dark: list[float] = []
        try:
            await sup.activate("a")
            for _ in range(injections):
                async with httpx.AsyncClient(timeout=30) as client:
                    await client.post(
                        f"http://127.0.0.1:{port}/sim/fault", json={"kind": "engine-dead"}
                    )
                t0 = time.time()
                seen = await until(lambda t0=t0: left_ready_since(sup, t0 - 0.5))
                dark.append(seen - t0)
                await until(lambda: sup.statuses["a"].state is LaneState.READY)
        finally:
            subprocess.run(["systemctl", "--user", "stop", f"{tag}-a.service"], check=False)
            await sup.close()
            await sup.seam.close()
            (unit_dir / f"{tag}-a.service").unlink(missing_ok=True)
            subprocess.run(["systemctl", "--user", "daemon-reload"], check=False)
    return {"injections": injections, "to_left_ready_ms": summary(dark)}


async def bench(injections: int) -> dict[str, Any]:
    env = harness_env()
    os.environ.update(env)
    tag = f"benchdet{uuid.uuid4().hex[:6]}"
    unit_dir = Path(env["XDG_CONFIG_HOME"]) / "systemd" / "user"
    port = free_port()
    results: dict[str, Any] = {"injections_each": injections, "cores": os.cpu_count()}
    with tempfile.TemporaryDirectory() as tmp:
        text = (
            f'[daemon]\nunit_dir = "{unit_dir}"\nbin_dir = "{tmp}/bin"\nstate_dir = "{tmp}/state"\n'
            'listen = "127.0.0.1:1"\n'
            + sim_lane(
                "a",
                f"{tag}-a.service",
                port,
                'restart_sec = "100ms"\nstart_limit_burst = 100000\n'
                f'probe = {{ interval = "200ms", failures = 1000, stall_after = "{STALL_AFTER:g}s", '
                'start_interval_min = "50ms", start_interval_max = "200ms" }\n',
                env='LANED_SIM_DECODE_TPS = "50"\n',
            )
        )
        sup = supervisor_on(text, tmp, env)
        metrics = LanedMetrics()
        sup.recorder = metrics
        await sup.start()
        try:
            await sup.activate("a")
            async with httpx.AsyncClient(timeout=30) as client:
                for name, fault in FAULTS.items():
                    to_event, to_metric = [], []
                    for _ in range(injections):
                        counted = exits_counted(metrics)
                        await client.post(f"http://127.0.0.1:{port}/sim/fault", json=fault)
                        t0 = time.time()  # the fault's answer: the engine ends right after
                        seen = await until(lambda t0=t0: restarted_since(sup, t0 - 0.5))
                        metric = await until(lambda c=counted: exits_counted(metrics) > c)
                        to_event.append(seen - t0)
                        to_metric.append(metric - t0)
                        await until(lambda: sup.statuses["a"].state is LaneState.READY)
                    results[name] = {
                        "to_event_ms": summary(to_event),
                        "to_metric_ms": summary(to_metric),
                    }
            # A new client: the pooled connections went with the engines the faults ended.
            async with httpx.AsyncClient(timeout=30) as client:
                results["stall"] = await stall(client, sup, port)
        finally:
            subprocess.run(["systemctl", "--user", "stop", f"{tag}-a.service"], check=False)
            await sup.close()
            await sup.seam.close()
            (unit_dir / f"{tag}-a.service").unlink(missing_ok=True)
            subprocess.run(["systemctl", "--user", "daemon-reload"], check=False)
    return results


async def stall(client: httpx.AsyncClient, sup: Supervisor, port: int) -> dict[str, float]:
    """A request running, then the engine wedged: from the wedge to laned's restart."""
    body = {
        "model": "a",
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 2000,
        "ignore_eos": True,  # vLLM's: a long answer, whatever the prompt
        "stream": True,
    }
    request = asyncio.ensure_future(
        client.post(f"http://127.0.0.1:{port}/v1/chat/completions", json=body)
    )
    # Running, as laned's own reading of the engine's /metrics says.
    await until(lambda: (sup.engine_summary("a") or {}).get("requests_running", 0) >= 1)
    await client.post(f"http://127.0.0.1:{port}/sim/fault", json={"kind": "stall"})
    t0 = time.time()
    try:
        seen = await until(lambda: restarted_since(sup, t0), timeout=STALL_AFTER * 10)
    finally:
        request.cancel()
    await until(lambda: sup.statuses["a"].state is LaneState.READY)
    return {"window_s": STALL_AFTER, "to_restart_s": seen - t0}


def summary(values: list[float]) -> dict[str, float]:
    ms = [v * 1e3 for v in values]
    return {"p50": statistics.median(ms), "p99": pct(ms, 0.99), "max": max(ms)}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--injections", type=int, default=50, help="of each kind of exit")
    parser.add_argument("--dead", type=int, default=20, help="engine deaths (vLLM's 503, exit 0)")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    result = asyncio.run(bench(args.injections))
    result["engine dead"] = asyncio.run(engine_dead(args.dead))
    print(f"detection, {args.injections} injections of each exit, {result['cores']} cores")
    for name in FAULTS:
        e, m = result[name]["to_event_ms"], result[name]["to_metric_ms"]
        print(f"  {name:8} -> event p50 {e['p50']:6.1f} ms  p99 {e['p99']:6.1f} ms  max {e['max']:6.1f} ms"
              f" | -> metric p50 {m['p50']:6.1f} ms  p99 {m['p99']:6.1f} ms")  # fmt: skip
    s = result["stall"]
    print(
        f"  stall: restarted {s['to_restart_s']:.2f} s after the wedge (window {s['window_s']:g} s)"
    )
    d = result["engine dead"]["to_left_ready_ms"]
    print(
        f"  engine dead (503, exit 0 within 5 s; default probing): left ready p50 "
        f"{d['p50']:.0f} ms  p99 {d['p99']:.0f} ms  max {d['max']:.0f} ms"
    )
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
