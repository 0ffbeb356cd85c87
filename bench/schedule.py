#!/usr/bin/env python3
"""Requests for two models of one group, under laned's policy and under FIFO, side by side
(prints figures and writes JSON; asserts nothing).

    scripts/harness up && .venv/bin/python bench/schedule.py [--turns 8] [--startup 4]

One workload, replayed against `laned serve` twice, once per `[daemon] schedule`: two
simulated lanes `a` and `b` of one group, both `on_demand`, whose cold start is scaled down
(`--startup` seconds; a real one is minutes: laned's policy reads the measured figure, so
the ratios hold). The workload, the same both times:

- two agents, `--think` seconds between an answer and its next request, in two shapes run
  apart: `alternating` (each agent alternates the two models turn by turn: agent 1 a b a b
  ..., agent 2 b a b a ..., an editor's architect mode) and `own` (agent 1 asks a, agent 2
  asks b: two people, two models);
- a long batch on `a`: `--batch` requests one after another from the start.

Per policy: swaps (laned_schedule_swaps_total), requests completed and refused, and each
request's wait (sent -> its first content chunk: the queue, the swap, the prefill), p50,
p95 and max, for the agents and the batch apart. `fifo` is what a queue in arrival order
does (llama-swap's): it swaps to the head of the queue as soon as the resident lane has
nothing in flight.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import LanedServe, free_port, harness_env, pct, sim_lane


class Client:
    """Timed chat requests through laned's endpoint."""

    def __init__(self, http: httpx.AsyncClient, tokens: int) -> None:
        self.http, self.tokens = http, tokens
        self.waits: list[float] = []
        self.refused = 0

    async def ask(self, model: str) -> None:
        body = {
            "model": model, "messages": [{"role": "user", "content": "next step"}],
            "max_tokens": self.tokens, "ignore_eos": True, "stream": True,
        }  # fmt: skip
        sent = time.perf_counter()
        async with self.http.stream("POST", "/v1/chat/completions", json=body) as sse:
            if sse.status_code != 200:
                self.refused += 1
                await sse.aread()
                return
            first = None
            async for line in sse.aiter_lines():
                if first is None and line.startswith("data: {") and '"content"' in line:
                    first = time.perf_counter() - sent
        if first is not None:
            self.waits.append(first)


async def workload(url: str, shape: str, turns: int, think: float, batch: int) -> dict[str, Any]:
    async with httpx.AsyncClient(base_url=url, timeout=600) as http:
        agents, long = Client(http, 40), Client(http, 40)

        async def agent(first: int) -> None:
            for turn in range(turns):
                step = turn if shape == "alternating" else 0
                await agents.ask("ab"[(step + first) % 2])
                await asyncio.sleep(think)

        async def job() -> None:
            for _ in range(batch):
                await long.ask("a")

        began = time.perf_counter()
        await asyncio.gather(agent(0), agent(1), job())
        took = time.perf_counter() - began
        metrics = (await http.get("/metrics")).text
    swaps = sum(
        float(line.rsplit(" ", 1)[1])
        for line in metrics.splitlines()
        if line.startswith("laned_schedule_swaps_total{")
    )
    return {
        "seconds": round(took, 1),
        "swaps": int(swaps),
        "agents": figures(agents, 2 * turns),
        "batch": figures(long, batch),
    }


def figures(client: Client, sent: int) -> dict[str, Any]:
    waits = client.waits
    return {
        "sent": sent,
        "completed": len(waits),
        "refused": client.refused,
        "wait_p50_s": round(statistics.median(waits), 2) if waits else None,
        "wait_p95_s": round(pct(waits, 0.95), 2) if waits else None,
        "wait_max_s": round(max(waits), 2) if waits else None,
    }


def run(policy: str, shape: str, args: argparse.Namespace, env: dict[str, str]) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        api, ports = free_port(), {"a": free_port(), "b": free_port()}
        units = {n: f"laned-bench-schedule-{n}.service" for n in ports}
        lane_env = 'LANED_SIM_DECODE_TPS = "50"\n'
        text = (
            f'[daemon]\nlisten = "127.0.0.1:{api}"\nstate_dir = "{tmp}/state"\n'
            f'bin_dir = "{tmp}/bin"\ndefault_lane = "a"\nschedule = "{policy}"\n'
        )
        for name, port in ports.items():
            lane = sim_lane(name, units[name], port, 'on_demand = true\nrestart_sec = "1s"\n', lane_env, tmp)  # fmt: skip
            text += lane.replace('LANED_SIM_STARTUP = "1"', f'LANED_SIM_STARTUP = "{args.startup:g}"') + "\n"  # fmt: skip
        path = Path(tmp) / "laned.toml"
        path.write_text(text)
        with LanedServe(path, api, env, list(units.values()), ready=1) as laned:
            out = asyncio.run(workload(laned.url, shape, args.turns, args.think, args.batch))
        out["policy"], out["shape"] = policy, shape
        return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--turns", type=int, default=8, help="each agent's requests")
    parser.add_argument("--think", type=float, default=0.3, help="seconds between turns")
    parser.add_argument("--batch", type=int, default=40, help="requests of the long job on a")
    parser.add_argument("--startup", type=float, default=4.0, help="a lane's cold start, s")
    parser.add_argument("--shape", choices=("alternating", "own"), help="one shape only")
    parser.add_argument("--json", type=Path, help="write the figures here too")
    args = parser.parse_args()
    env = harness_env()
    shapes = (args.shape,) if args.shape else ("alternating", "own")
    results = [run(p, shape, args, env) for shape in shapes for p in ("laned", "fifo")]
    print(f"{'shape':11} {'policy':6} {'swaps':>5} {'took s':>7}  {'who':7} {'done':>9} {'refused':>7} {'p50 s':>6} {'p95 s':>6} {'max s':>6}")  # fmt: skip
    for r in results:
        for who in ("agents", "batch"):
            f = r[who]
            print(
                f"{r['shape']:11} {r['policy']:6} {r['swaps']:>5} {r['seconds']:>7}  {who:7} "
                f"{f['completed']:>4}/{f['sent']:<4} {f['refused']:>7} {f['wait_p50_s']!s:>6} "
                f"{f['wait_p95_s']!s:>6} {f['wait_max_s']!s:>6}"
            )
    if args.json:
        args.json.write_text(json.dumps({"args": vars(args) | {"json": None}, "results": results}, indent=2) + "\n")  # fmt: skip


if __name__ == "__main__":
    main()
