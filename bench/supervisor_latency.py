#!/usr/bin/env python3
"""How fast the supervisor sees things, against the real harness (prints figures, asserts nothing).

    scripts/harness up && .venv/bin/python bench/supervisor_latency.py [--rounds 5]

- exit seen: from the engine's exit (fault reply) to laned's `restarting` event — the
  wrapper's exit, systemd's state change and its PropertiesChanged signal;
- ready lag: from the engine's port first accepting a connection to laned's `ready` event
  (readiness probing backs off from probe.start_interval_min);
- swap: activate(b) with a ready: total, and the stop part (a `stopping` -> `inactive`).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import free_port, harness_env, sim_lane, supervisor_on
from laned.core.lanes import LaneState
from laned.owner.supervisor import Supervisor


def accepts(port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(0.05)
        return sock.connect_ex(("127.0.0.1", port)) == 0


def event_time(sup: Supervisor, lane: str, state: LaneState, after: float) -> float | None:
    for event in sup.events:
        if event.lane == lane and event.to_state is state and event.at >= after:
            return event.at
    return None


async def wait_event(
    sup: Supervisor, lane: str, state: LaneState, after: float, timeout: float = 60
) -> float:
    deadline = time.time() + timeout
    while time.time() < deadline:
        at = event_time(sup, lane, state, after)
        if at is not None:
            return at
        await asyncio.sleep(0.002)
    raise TimeoutError(f"{lane} never reached {state.value}")


async def watch_port(port: int, since: float) -> float:
    while not accepts(port):
        await asyncio.sleep(0.002)
    return time.time()


async def bench(rounds: int) -> None:
    env = harness_env()
    os.environ.update(env)
    tag = f"bench{uuid.uuid4().hex[:6]}"
    unit_dir = Path(env["XDG_CONFIG_HOME"]) / "systemd" / "user"
    port = free_port()
    with tempfile.TemporaryDirectory() as tmp:
        text = f'[daemon]\nunit_dir = "{unit_dir}"\nbin_dir = "{tmp}/bin"\nstate_dir = "{tmp}/state"\nlisten = "127.0.0.1:1"\n'
        for lane in ("a", "b"):
            text += sim_lane(
                lane,
                f"{tag}-{lane}.service",
                port,
                'restart_sec = "100ms"\nstart_limit_burst = 1000\n'
                'probe = { failures = 1000, start_interval_min = "50ms", start_interval_max = "1s" }\n',
            )
        sup = supervisor_on(text, tmp, env)
        await sup.start()
        exits, ready_lags, swaps, stops = [], [], [], []
        try:
            await sup.activate("a")
            async with httpx.AsyncClient() as client:
                for _ in range(rounds):
                    t0 = time.time()
                    await client.post(
                        f"http://127.0.0.1:{port}/sim/fault", json={"kind": "exit", "code": 0}
                    )
                    seen = await wait_event(sup, "a", LaneState.RESTARTING, t0)
                    exits.append(seen - t0)
                    await asyncio.sleep(
                        0.05
                    )  # let the old engine release the port before watching it
                    opened = await watch_port(port, t0)
                    ready = await wait_event(sup, "a", LaneState.READY, t0)
                    ready_lags.append(ready - opened)
            for i in range(rounds):
                new, old = ("b", "a") if i % 2 == 0 else ("a", "b")
                t0 = time.time()
                await sup.activate(new)
                swaps.append(time.time() - t0)
                stops.append(
                    await wait_event(sup, old, LaneState.INACTIVE, t0)
                    - await wait_event(sup, old, LaneState.STOPPING, t0)
                )
        finally:
            for lane in ("a", "b"):
                subprocess.run(
                    ["systemctl", "--user", "stop", f"{tag}-{lane}.service"], check=False
                )
            await sup.close()
            await sup.seam.close()
            for lane in ("a", "b"):
                (unit_dir / f"{tag}-{lane}.service").unlink(missing_ok=True)
            subprocess.run(["systemctl", "--user", "daemon-reload"], check=False)

    def row(name: str, values: list[float]) -> None:
        ms = [v * 1000 for v in values]
        print(
            f"{name:38} median {statistics.median(ms):8.1f} ms   max {max(ms):8.1f} ms   (n={len(ms)})"
        )

    print(f"supervisor latency, {rounds} rounds, simulated cold start 1 s, {os.cpu_count()} cores")
    row("engine exit -> `restarting` event", exits)
    row("port accepts -> `ready` event", ready_lags)
    row("swap: old lane stopping -> inactive", stops)
    row("swap: activate() -> new lane ready", swaps)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    asyncio.run(bench(args.rounds))


if __name__ == "__main__":
    main()
