#!/usr/bin/env python3
"""laned's own CPU per request at its OpenAI endpoint (prints figures and writes JSON;
asserts nothing):

    scripts/harness up && .venv/bin/python bench/proxy_cost.py [--requests 600] [--json FILE]

`laned serve` runs as its own process over two simulated lanes, so that what is measured is
laned: its user + system CPU time from /proc across each phase, less its idle rate (probes,
scrapes) measured just before, divided by what passed through it.

- non-streamed: `--requests` completions of one token, 8 at a time, on lane `a`, whose
  engine is as fast as it goes: CPU per request;
- streamed: streams of `--tokens` tokens on lane `b`, whose engine decodes `--tps` tokens a
  second a stream (each token its own chunk on the wire, as a real engine sends them), at 1,
  16 and 64 at a time (`--streams` of them at each level): CPU per chunk, taken as (CPU per
  stream - CPU per non-streamed request) / SSE events, and per stream.

Then the same phases through the floor (bench/relay_floor.py: a relay in Python that passes
bytes through and does nothing else, one in front of each engine), measured the same way.
The load generator (httpx, in this process) shares the machine's cores; laned's CPU is
laned's alone. Throughput beside the engine reached directly, and latency, are
bench/api.py's and bench/proxy.py's.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import LanedServe, cpu_seconds, free_port, harness_env, sim_lane

FAST = 'LANED_SIM_DECODE_TPS = "1000000"\nLANED_SIM_PREFILL_TPS = "100000000"\n'


async def completions(url: str, count: int, at_once: int) -> int:
    """`count` one-token completions, `at_once` in flight: how many answered 200."""
    body = {"model": "a", "prompt": "hello", "max_tokens": 1}
    left = iter(range(count))
    codes: dict[int, int] = {}

    async def worker(client: httpx.AsyncClient) -> None:
        for _ in left:
            code = (await client.post("/v1/completions", json=body)).status_code
            codes[code] = codes.get(code, 0) + 1

    limits = httpx.Limits(max_connections=at_once, max_keepalive_connections=at_once)
    async with httpx.AsyncClient(base_url=url, timeout=60, limits=limits) as client:
        await asyncio.gather(*(worker(client) for _ in range(at_once)))
    assert set(codes) == {200}, f"answers by status: {codes}"
    return codes[200]


async def streams(url: str, count: int, at_once: int, tokens: int) -> int:
    """`count` streams of `tokens` tokens, `at_once` in flight: the SSE events received."""
    body = {"model": "b", "prompt": "hello", "max_tokens": tokens, "ignore_eos": True, "stream": True}  # fmt: skip
    left = iter(range(count))
    events = 0

    async def worker(client: httpx.AsyncClient) -> None:
        nonlocal events
        for _ in left:
            async with client.stream("POST", "/v1/completions", json=body) as sse:
                assert sse.status_code == 200, sse.status_code
                async for line in sse.aiter_lines():
                    events += line.startswith("data: ")

    limits = httpx.Limits(max_connections=at_once, max_keepalive_connections=at_once)
    async with httpx.AsyncClient(base_url=url, timeout=120, limits=limits) as client:
        await asyncio.gather(*(worker(client) for _ in range(at_once)))
    return events


def measured(pid: int, idle_rate: float, run: Any) -> tuple[Any, float]:
    """(what `run` returned, the process's CPU seconds across it less its idle rate)."""
    cpu, began = cpu_seconds(pid), time.monotonic()
    result = asyncio.run(run)
    took = time.monotonic() - began
    return result, max(cpu_seconds(pid) - cpu - idle_rate * took, 0.0)


def idle_rate(pid: int, seconds: float = 3.0) -> float:
    """The process's CPU share while nothing is sent to it."""
    cpu, began = cpu_seconds(pid), time.monotonic()
    time.sleep(seconds)
    return (cpu_seconds(pid) - cpu) / (time.monotonic() - began)


def phases(args: argparse.Namespace, fast: tuple[str, int], paced: tuple[str, int]) -> dict[str, Any]:  # fmt: skip
    """CPU per non-streamed request (to `fast`: base URL, pid) and per streamed chunk (to
    `paced`) at 1, 16 and 64 streams at a time."""
    asyncio.run(completions(fast[0], 50, 8))  # warm: connections, caches
    idle = idle_rate(fast[1])
    ok, spent = measured(fast[1], idle, completions(fast[0], args.requests, 8))
    per_request = spent / max(ok, 1)
    out: dict[str, Any] = {
        "idle_cpu_share": round(idle, 4),
        "non_streamed": {"requests": ok, "cpu_ms_per_request": round(per_request * 1e3, 3)},
        "streamed": {},
    }
    idle = idle_rate(paced[1]) if paced[1] != fast[1] else idle
    for at_once in (1, 16, 64):
        events, spent = measured(paced[1], idle, streams(paced[0], args.streams, at_once, args.tokens))  # fmt: skip
        per_stream = spent / args.streams
        chunks = events / args.streams
        out["streamed"][str(at_once)] = {
            "streams": args.streams,
            "events_per_stream": round(chunks, 1),
            "cpu_ms_per_stream": round(per_stream * 1e3, 3),
            "cpu_us_per_chunk": round((per_stream - per_request) / chunks * 1e6, 1),
        }
    return out


def relay(engine: int) -> tuple[subprocess.Popen[bytes], str]:
    """bench/relay_floor.py in front of the engine on `engine`: (its process, its URL)."""
    port = free_port()
    script = Path(__file__).resolve().parent / "relay_floor.py"
    process = subprocess.Popen([sys.executable, str(script), str(port), str(engine)])
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return process, f"http://127.0.0.1:{port}"
        except OSError:
            time.sleep(0.05)
    process.kill()
    raise TimeoutError("the floor's relay did not listen")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=600)
    parser.add_argument("--streams", type=int, default=64, help="streams at each level")
    parser.add_argument("--tokens", type=int, default=100)
    parser.add_argument("--tps", type=float, default=200.0, help="lane b's decode rate a stream")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    env = {**os.environ, **harness_env()}
    with tempfile.TemporaryDirectory() as tmp:
        api, ports = free_port(), {"a": free_port(), "b": free_port()}
        units = [f"benchcost{os.getpid()}-{lane}.service" for lane in "ab"]
        text = f'[daemon]\nlisten = "127.0.0.1:{api}"\nstate_dir = "{tmp}/state"\nbin_dir = "{tmp}/bin"\n'  # fmt: skip
        text += sim_lane("a", units[0], ports["a"], 'group = "a"\ngpus = []\n', FAST, model=tmp)
        paced = f'LANED_SIM_DECODE_TPS = "{args.tps:g}"\nLANED_SIM_PREFILL_TPS = "100000000"\n'
        text += sim_lane("b", units[1], ports["b"], 'group = "b"\ngpus = []\n', paced, model=tmp)
        path = Path(tmp) / "laned.toml"
        path.write_text(text)
        with LanedServe(path, api, env, units, ready=0) as laned:
            for lane in "ab":
                httpx.post(f"{laned.url}/lanes/{lane}/activate", params={"wait": "true"}, timeout=120).raise_for_status()  # fmt: skip
            pid = laned.process.pid
            out = phases(args, (laned.url, pid), (laned.url, pid))
            relays = [relay(ports[lane]) for lane in "ab"]
            try:
                (fast, fast_url), (slow, slow_url) = relays
                out["floor"] = phases(args, (fast_url, fast.pid), (slow_url, slow.pid))
            finally:
                for process, _ in relays:
                    process.kill()
    floor = out["floor"]
    print(f"laned idle: {out['idle_cpu_share'] * 100:.2f} % of a core")
    print("CPU                          laned    floor (bench/relay_floor.py)")
    print(f"a non-streamed request  {out['non_streamed']['cpu_ms_per_request']:8.3f} ms {floor['non_streamed']['cpu_ms_per_request']:8.3f} ms")  # fmt: skip
    for level, row in out["streamed"].items():
        print(f"a chunk, {level:>2} streams      {row['cpu_us_per_chunk']:8.1f} µs {floor['streamed'][level]['cpu_us_per_chunk']:8.1f} µs   ({row['events_per_stream']:.0f} events a stream)")  # fmt: skip
    if args.json:
        meta = {"cores": os.cpu_count(), "date": time.strftime("%Y-%m-%d"), "args": {k: v for k, v in vars(args).items() if k != "json"}}  # fmt: skip
        args.json.write_text(json.dumps({**meta, **out}, indent=2) + "\n")


if __name__ == "__main__":
    main()
