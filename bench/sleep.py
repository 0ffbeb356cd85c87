#!/usr/bin/env python3
"""A swap back to a lane that was stopped, sleeps at level 2, or sleeps at level 1 (prints
figures, writes JSON, asserts nothing):

    scripts/harness up && .venv/bin/python bench/sleep.py [--rounds 3] [--cold 30]
        [--weights-gib 16] [--reload-gibps 2] [--json F]

Four simulator lanes of one group on the real user manager, driven by laned's supervisor:
`stopped` (sleep_level 0), `level2`, `level1`, and `other`. Each round activates a lane,
swaps to `other` (the lane stops or sleeps), and times the swap back: activate → ready, and
how long the lane itself took to go (stop or sleep). The simulator's timings come from the
sources laned/sim/sleep.py cites: a cold start of --cold seconds (imports, weight load,
compile, graphs: all of it), a level-1 sleep pins host memory at 0.49 s/GiB and copies at
51.4 GiB/s both ways (measured on the H200 with torch), a level-2 wake reads the weights
again at --reload-gibps. So the wake figures are the simulator's model plus laned's own
overhead around it (its gate, the wake calls, probes), which is what this bench isolates.
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

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import free_port, harness_env, sim_lane, supervisor_on
from laned.core.lanes import LaneState

RUNGS = {"stopped": 0, "level2": 2, "level1": 1}


async def bench(rounds: int, cold: float, weights: float, reload_gibps: float) -> dict[str, Any]:
    env = harness_env()
    os.environ.update(env)
    tag = f"benchsleep{uuid.uuid4().hex[:6]}"
    unit_dir = Path(env["XDG_CONFIG_HOME"]) / "systemd" / "user"
    sim_env = (
        f'LANED_SIM_WEIGHTS_GIB = "{weights:g}"\nLANED_SIM_RELOAD_GIBPS = "{reload_gibps:g}"\n'
    )

    probe = 'probe = { start_interval_min = "50ms", start_interval_max = "200ms" }\n'
    results: dict[str, Any] = {
        "rounds": rounds,
        "cold_start_s": cold,
        "weights_gib": weights,
        "reload_gibps": reload_gibps,
        "cores": os.cpu_count(),
    }
    with tempfile.TemporaryDirectory() as tmp:
        text = (
            f'[daemon]\nunit_dir = "{unit_dir}"\nbin_dir = "{tmp}/bin"\nstate_dir = "{tmp}/state"\n'
            'listen = "127.0.0.1:1"\n'
        )
        for name, level in {**RUNGS, "other": 0}.items():
            extra = f'sleep_level = {level}\nstart_timeout = "10m"\n{probe}'
            lane = sim_lane(name, f"{tag}-{name}.service", free_port(), extra, env=sim_env)
            text += lane.replace('LANED_SIM_STARTUP = "1"', f'LANED_SIM_STARTUP = "{cold:g}"')
        sup = supervisor_on(text, tmp, env)
        await sup.start()
        try:
            await sup.activate("other")
            for rung in RUNGS:
                back, away = [], []
                await sup.activate(rung)  # a first (cold) start
                for _ in range(rounds):
                    began = time.monotonic()
                    await sup.activate("other")
                    away.append(time.monotonic() - began)
                    want = LaneState.INACTIVE if RUNGS[rung] == 0 else LaneState.SLEEPING
                    assert sup.statuses[rung].state is want, sup.statuses[rung]
                    began = time.monotonic()
                    await sup.activate(rung)
                    back.append(time.monotonic() - began)
                results[rung] = {
                    "swap_back_s": summary(back),
                    "swap_away_s": summary(away),
                    "last_wake_s": sup.statuses[rung].last_wake,
                }
                await sup.deactivate(rung)
        finally:
            for name in (*RUNGS, "other"):
                subprocess.run(
                    ["systemctl", "--user", "stop", f"{tag}-{name}.service"], check=False
                )
                (unit_dir / f"{tag}-{name}.service").unlink(missing_ok=True)
            await sup.close()
            await sup.seam.close()
            subprocess.run(["systemctl", "--user", "daemon-reload"], check=False)
    return results


def summary(values: list[float]) -> dict[str, float]:
    return {
        "median": round(statistics.median(values), 3),
        "min": round(min(values), 3),
        "max": round(max(values), 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--cold", type=float, default=30.0, help="simulated cold start, seconds")
    parser.add_argument("--weights-gib", type=float, default=16.0)
    parser.add_argument("--reload-gibps", type=float, default=2.0)
    parser.add_argument("--json", help="also write the figures here")
    args = parser.parse_args()
    results = asyncio.run(bench(args.rounds, args.cold, args.weights_gib, args.reload_gibps))
    print(
        f"swap back, {args.rounds} rounds, {args.weights_gib:g} GiB of weights, "
        f"a {args.cold:g} s cold start, level-2 reload at {args.reload_gibps:g} GiB/s"
    )
    for rung in RUNGS:
        back, away = results[rung]["swap_back_s"], results[rung]["swap_away_s"]
        print(
            f"  {rung:8} activate -> ready median {back['median']:7.3f} s "
            f"(min {back['min']:.3f}, max {back['max']:.3f}); the swap away took "
            f"{away['median']:.3f} s"
        )
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
