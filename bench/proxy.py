#!/usr/bin/env python3
"""What laned's OpenAI endpoint costs a client: the same streaming load sent to the engine's
port directly and through laned (prints figures and writes JSON; asserts nothing).

    scripts/harness up && .venv/bin/python bench/proxy.py [--concurrency 16] [--rounds 6]

laned runs as its own process (`laned serve`) over one simulated lane, so that its CPU time
can be read from /proc. Phases alternate direct and proxied so that drift on a noisy
machine falls on both. In a phase `concurrency` clients each send `requests` streaming chat
requests one after another (a closed loop, as vLLM's benchmark_serving --max-concurrency;
answer lengths drawn from one seeded list for both ways) with httpx's async client, one
pool, and read every SSE chunk.

- throughput: completion tokens of a phase / the phase's wall time;
- time to first token: request sent -> first chunk with content, with every connection open
  (an untimed burst of one short request per client opens them before each phase: a phase
  outlasts the keep-alive of the connections of the other way, and 16 connections opened at
  once by one client on 2 cores measure the client more than laned);
- after idle: `--idle-bursts` times, the clients wait past every keep-alive (the engine's
  5 s) and then send one request each at once: the time to first token of a burst that must
  open its connections (client -> laned -> engine), for each way;
- laned CPU per request: laned's user+system CPU over the proxied rounds, less its idle
  rate (probes, scrapes) over the direct rounds, per proxied request.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import ROOT, cpu_seconds, free_port, harness_env, pct, sim_lane
from laned.sim.http import KEEP_ALIVE


async def one(client: httpx.AsyncClient, url: str, body: dict[str, Any]) -> tuple[float, int]:
    """One streaming request: (seconds to the first content chunk, completion tokens)."""
    sent = time.perf_counter()
    first = None
    tokens = 0
    async with client.stream("POST", url, json=body) as sse:
        assert sse.status_code == 200, sse.status_code
        async for line in sse.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            data = json.loads(line[6:])
            if data.get("usage"):
                tokens = data["usage"]["completion_tokens"]
            if first is None and data.get("choices") and data["choices"][0]["delta"].get("content"):
                first = time.perf_counter() - sent
    assert first is not None and tokens
    return first, tokens


async def phase(
    client: httpx.AsyncClient, url: str, body: dict[str, Any], lengths: list[list[int]]
) -> tuple[float, list[float]]:
    """`len(lengths)` clients, each sending its requests one after another (closed loop:
    always that many in flight); answer lengths differ, so arrivals spread as real ones do.
    (tokens per second over the phase, every time to first token)"""

    async def worker(mine: list[int]) -> list[tuple[float, int]]:
        return [await one(client, url, {**body, "max_tokens": n}) for n in mine]

    began = time.perf_counter()
    results = [r for rs in await asyncio.gather(*(worker(m) for m in lengths)) for r in rs]
    wall = time.perf_counter() - began
    return sum(t for _, t in results) / wall, [f for f, _ in results]


@contextlib.asynccontextmanager
async def one_lane(tps: float, tag: str) -> AsyncIterator[tuple[subprocess.Popen[bytes], int, int]]:  # fmt: skip
    """`laned serve` as its own process over one simulated lane `a`, whose engine decodes `tps`
    tokens a second a stream, once the lane is ready through laned: (laned's process, the
    engine's port, laned's port). The lane's unit is stopped and removed at the end."""
    env = harness_env()
    os.environ.update(env)
    unit = f"{tag}{uuid.uuid4().hex[:6]}-a.service"
    unit_dir = Path(env["XDG_CONFIG_HOME"]) / "systemd" / "user"
    port, api_port = free_port(), free_port()
    with tempfile.TemporaryDirectory() as tmp:
        config = Path(tmp) / "laned.toml"
        config.write_text(
            f'[daemon]\nunit_dir = "{unit_dir}"\nbin_dir = "{tmp}/bin"\nstate_dir = "{tmp}/state"\n'
            f'listen = "127.0.0.1:{api_port}"\ndefault_lane = "a"\n'
            + sim_lane("a", unit, port, env=f'LANED_SIM_DECODE_TPS = "{tps:g}"\n', model=tmp)
        )
        log = Path(tmp) / "laned.log"
        laned = subprocess.Popen(
            [sys.executable, "-m", "laned", "--config", str(config), "serve"],
            cwd=ROOT, stdout=log.open("wb"), stderr=subprocess.STDOUT,
        )  # fmt: skip
        try:
            async with httpx.AsyncClient(timeout=60) as client:
                await wait_ready(client, api_port, log)
            yield laned, port, api_port
        finally:
            laned.terminate()
            laned.wait(30)
            subprocess.run(["systemctl", "--user", "stop", unit], check=False)
            (unit_dir / unit).unlink(missing_ok=True)
            subprocess.run(["systemctl", "--user", "daemon-reload"], check=False)


async def bench(
    concurrency: int, rounds: int, per_client: int, tokens: int, tps: float, idle_bursts: int
) -> dict[str, Any]:
    async with one_lane(tps, "benchproxy") as (laned, port, api_port):
        limits = httpx.Limits(max_connections=concurrency * 2, keepalive_expiry=4)
        async with httpx.AsyncClient(timeout=120, limits=limits) as client:
            body = {
                "model": "a", "messages": [{"role": "user", "content": "hello"}],
                "max_tokens": tokens, "ignore_eos": True, "stream": True,
                "stream_options": {"include_usage": True},
            }  # fmt: skip
            urls = {
                "direct": f"http://127.0.0.1:{port}/v1/chat/completions",
                "proxy": f"http://127.0.0.1:{api_port}/v1/chat/completions",
            }
            draw = random.Random(7)
            lengths = [
                [draw.randint(tokens // 2, tokens * 3 // 2) for _ in range(per_client)]
                for _ in range(concurrency)
            ]
            for url in urls.values():  # warm both paths (connections, code)
                await phase(client, url, body, [[8]] * concurrency)
            figures: dict[str, dict[str, list[float]]] = {
                m: {"tps": [], "ttft": [], "cpu": [], "wall": [], "idle_burst": []} for m in urls
            }
            for i in range(rounds * 2):
                mode = ("direct", "proxy")[i % 2]
                await phase(client, urls[mode], body, [[8]] * concurrency)
                cpu0, t0 = cpu_seconds(laned.pid), time.perf_counter()
                tps_round, ttfts = await phase(client, urls[mode], body, lengths)
                figures[mode]["cpu"].append(cpu_seconds(laned.pid) - cpu0)
                figures[mode]["wall"].append(time.perf_counter() - t0)
                figures[mode]["tps"].append(tps_round)
                figures[mode]["ttft"].extend(ttfts)
            for _ in range(idle_bursts):
                for mode, url in urls.items():
                    await asyncio.sleep(KEEP_ALIVE + 1)
                    _, ttfts = await phase(client, url, body, [[tokens]] * concurrency)
                    figures[mode]["idle_burst"].extend(ttfts)
            metrics = (await client.get(f"http://127.0.0.1:{api_port}/metrics")).text
    result = summary(figures, concurrency, rounds * per_client, tokens, tps)
    sums = {
        name: float(line.split()[-1])
        for line in metrics.splitlines()
        for name in ("laned_proxy_overhead_seconds_sum", "laned_proxy_overhead_seconds_count")
        if line.startswith(name + "{")
    }
    result["laned_overhead_before_send_ms_mean"] = (
        sums["laned_proxy_overhead_seconds_sum"] / sums["laned_proxy_overhead_seconds_count"] * 1e3
    )
    # Its share within 1 and 2 ms, from the histogram's buckets: laned's own part of the
    # time to first token, free of the engine's and the machine's spread.
    buckets = {
        le: float(line.split()[-1])
        for line in metrics.splitlines()
        for le in ("0.001", "0.002")
        if line.startswith("laned_proxy_overhead_seconds_bucket{") and f'le="{le}"' in line
    }
    result["laned_overhead_before_send_within"] = {
        f"{float(le) * 1e3:g}ms": round(n / sums["laned_proxy_overhead_seconds_count"], 4)
        for le, n in buckets.items()
    }
    return result


async def wait_ready(
    client: httpx.AsyncClient, api_port: int, log: Path, timeout: float = 60
) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            view = (await client.get(f"http://127.0.0.1:{api_port}/lanes/a")).json()
            if view.get("state") == "ready":
                return
        except httpx.HTTPError:
            pass
        await asyncio.sleep(0.1)
    raise TimeoutError(f"lane a was not ready through laned within 60 s:\n{log.read_text()}")


def summary(
    figures: dict[str, dict[str, list[float]]],
    concurrency: int,
    per_client: int,
    tokens: int,
    tps: float,
) -> dict[str, Any]:
    direct, proxy = figures["direct"], figures["proxy"]
    idle_rate = sum(direct["cpu"]) / sum(direct["wall"])  # laned's CPU while it is not in the path
    requests = per_client * concurrency
    cpu_per_request = (sum(proxy["cpu"]) - idle_rate * sum(proxy["wall"])) / requests
    throughput = {m: statistics.median(f["tps"]) for m, f in figures.items()}
    ttft = {
        m: {"p50": pct(f["ttft"], 0.5) * 1e3, "p99": pct(f["ttft"], 0.99) * 1e3}
        for m, f in figures.items()
    }
    burst = {
        m: {"p50": pct(f["idle_burst"], 0.5) * 1e3, "max": max(f["idle_burst"]) * 1e3}
        for m, f in figures.items()
        if f["idle_burst"]
    }
    return {
        "concurrency": concurrency,
        "requests_each": requests,
        "max_tokens_mean": tokens,
        "sim_decode_tps_per_request": tps,
        "cores": os.cpu_count(),
        "throughput_tokens_per_s": throughput,
        "ttft_ms": ttft,
        "laned_cpu_ms_per_request": cpu_per_request * 1e3,
        "laned_idle_cpu_percent": idle_rate * 100,
        "throughput_ratio": throughput["proxy"] / throughput["direct"],
        "added_ttft_ms": {q: ttft["proxy"][q] - ttft["direct"][q] for q in ("p50", "p99")},
        "after_idle_burst_ttft_ms": burst,
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=4, help="phases of each kind")
    parser.add_argument("--requests", type=int, default=4, help="requests per client a phase")
    parser.add_argument("--max-tokens", type=int, default=200, help="the mean (0.5x-1.5x)")
    parser.add_argument("--tps", type=float, default=100, help="simulated tokens/s per request")
    parser.add_argument("--idle-bursts", type=int, default=3, help="bursts after idle, each way")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args()
    result = asyncio.run(
        bench(
            args.concurrency,
            args.rounds,
            args.requests,
            args.max_tokens,
            args.tps,
            args.idle_bursts,
        )
    )
    print(
        f"laned's OpenAI endpoint vs the engine's port: {args.concurrency} concurrent streaming "
        f"chats, {result['requests_each']} requests each way, ~{args.max_tokens} tokens at "
        f"{args.tps:g}/s a request, {result['cores']} cores"
    )
    for mode in ("direct", "proxy"):
        ttft = result["ttft_ms"][mode]
        print(
            f"  {mode:7} throughput {result['throughput_tokens_per_s'][mode]:8.0f} tok/s   "
            f"TTFT p50 {ttft['p50']:7.2f} ms   p99 {ttft['p99']:7.2f} ms"
        )
    for mode, figure in result["after_idle_burst_ttft_ms"].items():
        print(
            f"  {mode:7} after idle, {args.concurrency} at once (new connections): TTFT p50 "
            f"{figure['p50']:7.2f} ms   max {figure['max']:7.2f} ms"
        )
    added = result["added_ttft_ms"]
    print(
        f"  throughput proxy/direct {result['throughput_ratio']:.3f}   added TTFT p50 "
        f"{added['p50']:+.2f} ms, p99 {added['p99']:+.2f} ms   laned CPU "
        f"{result['laned_cpu_ms_per_request']:.2f} ms/request (idle {result['laned_idle_cpu_percent']:.1f} %)"
    )
    print(
        f"  laned's own time before a request goes to the engine: mean "
        f"{result['laned_overhead_before_send_ms_mean']:.3f} ms (laned_proxy_overhead_seconds), "
        + ", ".join(
            f"{share:.2%} within {le}"
            for le, share in result["laned_overhead_before_send_within"].items()
        )
    )
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
