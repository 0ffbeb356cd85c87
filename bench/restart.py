#!/usr/bin/env python3
"""An engine killed, ready again: a lane restarted from disk, the same lane restarted from
vLLM's weight cache, and that lane when its weight-cache daemon dies too (prints figures,
writes JSON, asserts nothing). The simulator plays both processes (laned/sim/preload.py)
under the harness's real user manager:

    scripts/harness up && .venv/bin/python bench/restart.py [--rounds 5] [--startup 8] [--json F]

Each round SIGKILLs the engine (the simulator's `crash` fault) or the daemon's unit, and
times from there: laned's `restarting` event (its detection), the new run's `starting`
event (after restart_sec, 100 ms here), and `ready`. The simulator's cold start lasts
--startup seconds, half of them the weight phase (laned/sim/startup.py), which a start from
the weight cache replaces by the mapping; what it does not replace (compile, profile,
graphs) stays, as in vLLM. The GPU's own floor under the mapping is bench/gpu_ipc.py's.
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

from bench.common import free_port, harness_env, sim_lane, supervisor_on
from laned.config.names import weights_unit_name
from laned.core.lanes import LaneState
from laned.owner.supervisor import Supervisor


def event_after(sup: Supervisor, lane: str, to: LaneState, since: float) -> float | None:
    """When the lane first moved into `to` after `since` (laned's event), or None."""
    for event in sup.events:
        if event.lane == lane and event.to_state is to and event.at >= since:
            return event.at
    return None


async def until(check: Any, timeout: float = 120) -> None:
    deadline = time.time() + timeout
    while not check():
        if time.time() > deadline:
            raise TimeoutError("the lane did not come back")
        await asyncio.sleep(0.01)


async def round_trip(sup: Supervisor, lane: str, kill: Any) -> dict[str, float]:
    """Kill (the engine or the daemon), then wait until ready: the timeline, in seconds."""
    restarts = sup.statuses[lane].restarts
    t0 = time.time()
    await kill()
    await until(lambda: sup.statuses[lane].restarts > restarts)
    await until(lambda: sup.statuses[lane].state is LaneState.READY)
    seen = event_after(sup, lane, LaneState.RESTARTING, t0 - 0.5) or t0
    started = event_after(sup, lane, LaneState.STARTING, seen) or seen
    ready = event_after(sup, lane, LaneState.READY, started) or time.time()
    return {
        "detected_s": round(seen - t0, 4),
        "start_after_s": round(started - t0, 4),
        "ready_after_s": round(ready - t0, 4),
        "start_to_ready_s": round(ready - started, 4),
        "kind": sup.statuses[lane].start_kind,  # type: ignore[dict-item]
    }


def summary(rows: list[dict[str, float]]) -> dict[str, Any]:
    out: dict[str, Any] = {"rounds": rows}
    for key in ("detected_s", "start_after_s", "ready_after_s", "start_to_ready_s"):
        values = [float(r[key]) for r in rows]
        out[f"{key[:-2]}_median_s"] = round(statistics.median(values), 3)
    out["kinds"] = sorted({str(r["kind"]) for r in rows})
    return out


async def bench(rounds: int, startup: float) -> dict[str, Any]:
    env = harness_env()
    os.environ.update(env)
    tag = f"benchrs{uuid.uuid4().hex[:6]}"
    unit_dir = Path(env["XDG_CONFIG_HOME"]) / "systemd" / "user"
    ports = {"disk": free_port(), "cache": free_port()}
    health, master = free_port(), free_port()
    results: dict[str, Any] = {"rounds": rounds, "sim_startup_s": startup, "cores": os.cpu_count()}
    with tempfile.TemporaryDirectory() as tmp:
        lane_env = 'LANED_SIM_WEIGHTS_GIB = "1"\n'
        common = 'restart_sec = "100ms"\nstart_limit_burst = 1000\n'
        common += 'probe = { interval = "200ms", start_interval_min = "50ms", start_interval_max = "200ms" }\n'
        text = (
            f'[daemon]\nunit_dir = "{unit_dir}"\nbin_dir = "{tmp}/bin"\nstate_dir = "{tmp}/state"\n'
            'listen = "127.0.0.1:1"\n'
            + sim_lane(
                "disk",
                f"{tag}-disk.service",
                ports["disk"],
                common + 'group = "d"\ngpus = [1]\n',
                lane_env,
                tmp,
            )
            + sim_lane(
                "cache",
                f"{tag}-cache.service",
                ports["cache"],
                # A GPU of its own (weight_cache needs one: CUDA IPC); the simulator runs on none.
                common + 'group = "c"\ngpus = [0]\n'
                f"weight_cache = {{ health_port = {health}, master_port = {master} }}\n",
                lane_env,
                tmp,
            )
        ).replace('LANED_SIM_STARTUP = "1"', f'LANED_SIM_STARTUP = "{startup:g}"')
        sup = supervisor_on(text, tmp, env)
        units = [f"{tag}-disk.service", f"{tag}-cache.service"]
        units.append(weights_unit_name("cache", sup.config.lanes["cache"]))
        await sup.start()
        try:
            cold: dict[str, float] = {}
            for lane in ("disk", "cache"):
                t0 = time.time()
                await sup.activate(lane)
                cold[lane] = round(time.time() - t0, 3)
            results["first_start_s"] = cold
            async with httpx.AsyncClient(timeout=30) as client:

                def crash(lane: str) -> Any:
                    async def kill() -> None:
                        await client.post(
                            f"http://127.0.0.1:{ports[lane]}/sim/fault",
                            json={"kind": "crash", "signal": 9},
                        )

                    return kill

                async def kill_daemon() -> None:
                    subprocess.run(
                        ["systemctl", "--user", "kill", "--signal=SIGKILL", units[2]], check=True
                    )

                for name, lane, kill in (
                    ("a_engine_killed_restart_from_disk", "disk", crash("disk")),
                    ("b_engine_killed_restart_from_weight_cache", "cache", crash("cache")),
                    ("c_daemon_killed_both_restart", "cache", kill_daemon),
                ):
                    rows = []
                    for _ in range(rounds):
                        rows.append(await round_trip(sup, lane, kill))
                        await asyncio.sleep(0.3)
                    results[name] = summary(rows)
                    print(
                        f"{name}: {json.dumps({k: v for k, v in results[name].items() if k != 'rounds'})}",
                        flush=True,
                    )
        finally:
            for unit in units:
                subprocess.run(["systemctl", "--user", "stop", unit], check=False)
            await sup.close()
            await sup.seam.close()
            for unit in units:
                (unit_dir / unit).unlink(missing_ok=True)
            subprocess.run(["systemctl", "--user", "daemon-reload"], check=False)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--startup", type=float, default=8.0, help="the simulator's cold start, s")
    parser.add_argument("--json")
    args = parser.parse_args()
    results = asyncio.run(bench(args.rounds, args.startup))
    results["date"] = time.strftime("%Y-%m-%d")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
