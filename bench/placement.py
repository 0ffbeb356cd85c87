#!/usr/bin/env python3
"""Placement against groups on one scenario (prints figures, writes JSON, asserts nothing): a
simulated four-GPU host (LANED_SIM_GPUS, 96 GiB each; laned/sim/gpu.py), the harness's real
user manager, laned's owner with its host adapter (the GPU-memory gate reads the simulated
GPUs), the simulator's vLLM with a --startup seconds cold start:

    scripts/harness up && .venv/bin/python bench/placement.py [--startup 4] [--json F]

Lanes: `big` (GPUs 0-1, --gpu-memory-utilization 0.9), `s1`, `s2`, `s4` (GPUs 2-3, 0.45 each),
`whole` (every GPU, 0.92). Steps, each ending when every lane it names has answered one chat
request: (1) big, s1, s2; (2) whole; (3) big, s1, s2 again; (4) s4, with big and s2 still
answering. Run twice: "placement" (laned.core.placement decides) and "groups" (the same
lanes, all of one `group`, served one after another as group-only laned must). Per step:
seconds to serve, lanes stopped.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import free_port, harness_env, sim_lane
from laned.core.lanes import LaneState
from laned.owner.supervisor import Supervisor

GIB = 2**30
LANES = {"big": ("[0, 1]", 0.9), "s1": ("[2, 3]", 0.45), "s2": ("[2, 3]", 0.45),
         "whole": ("", 0.92), "s4": ("[2, 3]", 0.45)}  # fmt: skip
STEPS = [("three", ["big", "s1", "s2"]), ("whole", ["whole"]),
         ("three_again", ["big", "s1", "s2"]), ("fourth", ["s4", "big", "s2"])]  # fmt: skip


def config_text(tmp: str, unit_dir: Path, tag: str, ports: dict[str, int], grouped: bool) -> str:
    sims = Path(tmp) / "gpus"
    text = (
        f'[daemon]\nunit_dir = "{unit_dir}"\nbin_dir = "{tmp}/bin"\nstate_dir = "{tmp}/state"\n'
        'listen = "127.0.0.1:1"\n'
    )
    for name, (gpus, share) in LANES.items():
        extra = 'restart_sec = "100ms"\nprobe = { interval = "200ms", start_interval_min = "50ms", start_interval_max = "200ms" }\n'  # fmt: skip
        extra += f"gpus = {gpus}\n" if gpus else ""
        extra += 'group = "box"\n' if grouped else ""
        extra += "priority = 1\n" if name == "s2" else ""
        extra += f'args = ["--gpu-memory-utilization", "{share}"]\n'
        (Path(tmp) / "models" / name).mkdir(parents=True, exist_ok=True)
        text += sim_lane(name, f"{tag}-{name}.service", ports[name], extra,
                         f'LANED_SIM_GPUS = "{sims}"\n', f"{tmp}/models/{name}")  # fmt: skip
    return text


def supervisor(text: str, tmp: str, env: dict[str, str]) -> Supervisor:
    from laned.adapters import rendered
    from laned.adapters.gpus import SimGpus
    from laned.adapters.host import Host
    from laned.adapters.podman import Podman
    from laned.adapters.probes import Probe
    from laned.adapters.systemd import Systemd
    from laned.owner.wiring import host_seam
    from laned.validation.load import parse_config

    config = parse_config(text, "bench", {"HOME": tmp})
    rendered.apply(config)
    subprocess.run(["systemctl", "--user", "daemon-reload"], check=True)
    host = Host(Podman(env["LANED_PODMAN_SOCKET"]), SimGpus(f"{tmp}/gpus"))
    return Supervisor(
        config, host_seam(Systemd(env["DBUS_SESSION_BUS_ADDRESS"]), Probe(), host), 252
    )


async def ask(client: httpx.AsyncClient, port: int, lane: str) -> None:
    body = {"model": lane, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    answer = await client.post(f"http://127.0.0.1:{port}/v1/chat/completions", json=body)
    answer.raise_for_status()


def stops(sup: Supervisor, since: float) -> int:
    """Lanes that went from serving to stopping (or asleep) since `since`: the swaps paid."""
    return sum(
        1
        for e in sup.events
        if e.at >= since
        and e.to_state in (LaneState.STOPPING, LaneState.SLEEPING)
        and e.from_state in (LaneState.READY, LaneState.DEGRADED)
    )


async def run(grouped: bool, startup: float) -> dict[str, Any]:
    env = harness_env()
    os.environ.update(env)
    tag = f"benchpl{uuid.uuid4().hex[:6]}"
    unit_dir = Path(env["XDG_CONFIG_HOME"]) / "systemd" / "user"
    ports = {name: free_port() for name in LANES}
    out: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "gpus").mkdir()
        gpus = [{"name": "Simulated 96 GB", "total_bytes": 96 * GIB}] * 4
        (Path(tmp) / "gpus" / "gpus.json").write_text(json.dumps({"gpus": gpus}))
        text = config_text(tmp, unit_dir, tag, ports, grouped).replace(
            'LANED_SIM_STARTUP = "1"', f'LANED_SIM_STARTUP = "{startup:g}"'
        )
        sup = supervisor(text, tmp, env)
        await sup.start()
        try:
            async with httpx.AsyncClient(timeout=60) as client:
                for step, lanes in STEPS:
                    t0 = time.time()
                    if grouped:  # one lane of the group at a time: each in turn
                        for lane in lanes:
                            await sup.activate(lane)
                            await ask(client, ports[lane], lane)
                    else:
                        await asyncio.gather(*(sup.activate(n) for n in lanes))
                        await asyncio.gather(*(ask(client, ports[n], n) for n in lanes))
                    took = time.time() - t0
                    out[step] = {"serve_all_s": round(took, 2), "lanes_stopped": stops(sup, t0)}
                    print(f"{'groups' if grouped else 'placement'} {step}: {out[step]}", flush=True)
        finally:
            units = [f"{tag}-{n}.service" for n in LANES]
            subprocess.run(["systemctl", "--user", "stop", *units], check=False)
            await sup.close()
            await sup.seam.close()
            for unit in units:
                (unit_dir / unit).unlink(missing_ok=True)
            subprocess.run(["systemctl", "--user", "daemon-reload"], check=False)
    out["total_s"] = round(sum(v["serve_all_s"] for v in out.values()), 2)
    out["total_stopped"] = sum(v["lanes_stopped"] for k, v in out.items() if k != "total_s")
    return out


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--startup", type=float, default=4.0, help="the simulator's cold start, s")
    parser.add_argument("--json")
    args = parser.parse_args()
    results: dict[str, Any] = {"sim_startup_s": args.startup, "cores": os.cpu_count()}
    results["placement"] = asyncio.run(run(False, args.startup))
    results["groups"] = asyncio.run(run(True, args.startup))
    results["date"] = time.strftime("%Y-%m-%d")
    print(json.dumps({k: results[k] for k in ("placement", "groups")}, indent=1))
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
