#!/usr/bin/env python3
"""What hostile input costs laned at its OpenAI endpoint, which needs no token (prints
figures and writes JSON; asserts nothing):

    scripts/harness up && .venv/bin/python bench/input_limits.py [--bodies 8] [--slow 200]

laned runs as its own process (`laned serve`, its default `[daemon.limits]`) over one
simulated lane, so that its memory can be read from /proc (VmRSS, sampled every 10 ms; the
peak is VmHWM's difference over the phase).

- bodies: `--bodies` concurrent requests each at the body limit (`--body-mib`, default 16,
  laned's default limit), valid JSON; then as many at `--huge-mib` (default 50), over it;
- slow: `--slow` connections that send half a request head and stop; how long until laned
  has answered and closed each one, and meanwhile how fast `GET /lanes` of another caller is.
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import contextlib
import json
import socket
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.proxy import one_lane


def rss_mib(pid: int, field: str = "VmRSS") -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    return 0.0


class Peak:
    """The highest VmRSS of a process while the block runs, sampled every 10 ms."""

    def __init__(self, pid: int) -> None:
        self.pid, self.peak, self._stop = pid, 0.0, threading.Event()

    def __enter__(self) -> Peak:
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def _sample(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, rss_mib(self.pid))
            time.sleep(0.01)

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def post(port: int, body: bytes) -> tuple[int, float]:
    """A raw POST of `body` (sent whole, whatever laned answers first); (status, seconds)."""
    began = time.monotonic()
    head = b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.settimeout(120)
        with contextlib.suppress(OSError):
            sock.sendall(head + b"Content-Length: %d\r\nConnection: close\r\n\r\n" % len(body) + body)  # fmt: skip
        got = b""
        with contextlib.suppress(OSError):
            while chunk := sock.recv(65536):
                got += chunk
    status = int(got.split(b" ", 2)[1]) if got.startswith(b"HTTP/") else 0
    return status, time.monotonic() - began


def half_sent(port: int) -> float:
    """Seconds until laned closes a connection that sent half a request head."""
    began = time.monotonic()
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.settimeout(300)
        sock.sendall(b"GET /lanes HTTP/1.1\r\nHost: 127.0.0.1\r\n")
        with contextlib.suppress(OSError):
            while sock.recv(65536):
                pass
    return time.monotonic() - began


def body_of(mib: float) -> bytes:
    prompt = "word " * int((mib * 1024 * 1024 - 100) / 5)
    return json.dumps({"model": "a", "prompt": prompt, "max_tokens": 1}).encode()


async def bench(bodies: int, body_mib: float, huge_mib: float, slow: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    async with one_lane(1000, "benchinput") as (laned, _, api_port):
        pid = laned.pid
        out["rss_idle_mib"] = round(rss_mib(pid), 1)
        pool = concurrent.futures.ThreadPoolExecutor(max(bodies, slow) + 4)
        loop = asyncio.get_running_loop()
        for name, mib in (("at_limit", body_mib), ("over_limit", huge_mib)):
            payload = body_of(mib)
            before = rss_mib(pid)
            with Peak(pid) as peak:
                answers = await asyncio.gather(
                    *(loop.run_in_executor(pool, post, api_port, payload) for _ in range(bodies))
                )
            out[name] = {
                "bodies": bodies,
                "body_mib": round(len(payload) / 2**20, 1),
                "statuses": sorted({status for status, _ in answers}),
                "rss_before_mib": round(before, 1),
                "rss_peak_mib": round(peak.peak, 1),
                "rss_after_mib": round(rss_mib(pid), 1),
                "slowest_answer_s": round(max(s for _, s in answers), 2),
            }
        if not slow:
            pool.shutdown()
            return out
        held = [loop.run_in_executor(pool, half_sent, api_port) for _ in range(slow)]
        reads: list[float] = []
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{api_port}", timeout=30) as client:  # fmt: skip
            while not all(f.done() for f in held):
                began = time.monotonic()
                (await client.get("/lanes")).raise_for_status()
                reads.append(time.monotonic() - began)
                await asyncio.sleep(0.01)
        closed = [f.result() for f in held]
        out["slow"] = {
            "connections": slow,
            "closed_after_s_median": round(statistics.median(closed), 2),
            "closed_after_s_max": round(max(closed), 2),
            "reads_meanwhile": len(reads),
            "read_ms_median": round(statistics.median(reads) * 1000, 2),
            "read_ms_max": round(max(reads) * 1000, 2),
        }
        pool.shutdown()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--bodies", type=int, default=8)
    parser.add_argument("--body-mib", type=float, default=15.9)
    parser.add_argument("--huge-mib", type=float, default=50)
    parser.add_argument("--slow", type=int, default=200)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    figures = asyncio.run(bench(args.bodies, args.body_mib, args.huge_mib, args.slow))
    print(json.dumps(figures, indent=2))
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2) + "\n")


if __name__ == "__main__":
    main()
