#!/usr/bin/env python3
"""Many large requests at once against laned's OpenAI endpoint: its memory against the
request memory budget, and whether its own answers and the user bus stay live (prints
figures and writes JSON; asserts nothing):

    scripts/harness up && .venv/bin/python bench/request_budget.py [--json out.json]

laned runs as its own process (`laned serve`, default `[daemon.limits]` unless
`--request-memory-mib`) over one simulated lane. Each phase sends its bodies at once, each
over its own connection (a raw socket: the whole body is written whatever laned answers
first), while another client reads `/healthz` and `GET /lanes` every 10 ms:

- bulk: `--bulk` bodies of `--bulk-mb` MB (128 x 15 MB), a prompt of text;
- many: `--many` bodies of `--many-mb` MB (1,000 x 1 MB);
- loop: `--loop` clients (64) each sending one `--loop-mb` MB body, text (`--loop-ids`: token
  ids, the costliest JSON to parse, about 250 ms for 16 MiB here, and for the simulated engine
  too: a phase of minutes).

For each: the statuses answered, laned's peak RSS (sampled every 10 ms, and VmHWM's rise),
the body parser workers' peak RSS, laned's own answers meanwhile (p50, p99, max), and how often
laned's log said it lost the user bus. The budget is read from laned's /metrics.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import json
import socket
import statistics
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import LanedServe, free_port, harness_env, pct, sim_lane


def status_of(pid: int, field: str) -> float:
    """A field of /proc/PID/status in MiB (0 when the process is gone)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def parsers(pid: int) -> list[int]:
    """laned's body parser workers (laned.adapters.body_parser)."""
    try:
        kids = [int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []
    out = []
    for kid in kids:
        with contextlib.suppress(OSError):
            if b"laned.adapters.body_parser" in Path(f"/proc/{kid}/cmdline").read_bytes():
                out.append(kid)
    return out


class Watch:
    """While the block runs: laned's and its children's peak RSS (every 10 ms), and laned's
    own answers (`/healthz`, `GET /lanes`) every 10 ms over one kept connection."""

    def __init__(self, pid: int, url: str) -> None:
        self.pid, self.url = pid, url
        self.peak = self.child_peak = 0.0
        self.answers: dict[str, list[float]] = {"/healthz": [], "/lanes": []}
        self.failed = 0
        self._stop = threading.Event()

    def __enter__(self) -> Watch:
        self.hwm = status_of(self.pid, "VmHWM")
        self._threads = [
            threading.Thread(target=self._sample, daemon=True),
            threading.Thread(target=self._ask, daemon=True),
        ]
        for thread in self._threads:
            thread.start()
        return self

    def _sample(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, status_of(self.pid, "VmRSS"))
            kids = sum(status_of(child, "VmRSS") for child in parsers(self.pid))
            self.child_peak = max(self.child_peak, kids)
            time.sleep(0.01)

    def _ask(self) -> None:
        with httpx.Client(base_url=self.url, timeout=30) as client:
            while not self._stop.is_set():
                for path, seconds in self.answers.items():
                    began = time.perf_counter()
                    try:
                        client.get(path).raise_for_status()
                        seconds.append(time.perf_counter() - began)
                    except httpx.HTTPError:
                        self.failed += 1
                time.sleep(0.01)

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join()
        self.hwm_rise = status_of(self.pid, "VmHWM") - self.hwm

    def figures(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "laned_rss_peak_mib": round(self.peak, 1),
            "laned_hwm_rise_mib": round(self.hwm_rise, 1),
            "parser_workers_rss_peak_mib": round(self.child_peak, 1),
            "own_answer_failures": self.failed,
        }
        for path, seconds in self.answers.items():
            if seconds:
                out[path] = {
                    "answers": len(seconds),
                    "p50_ms": round(statistics.median(seconds) * 1000, 1),
                    "p99_ms": round(pct(seconds, 0.99) * 1000, 1),
                    "max_ms": round(max(seconds) * 1000, 1),
                }
        return out


def post(port: int, body: bytes) -> int:
    """A raw POST of `body`, written whole whatever laned answers first: the status."""
    head = (
        b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        b"Content-Length: %d\r\nConnection: close\r\n\r\n" % len(body)
    )
    got = b""
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.settimeout(300)
        with contextlib.suppress(OSError):
            sock.sendall(head + body)
        with contextlib.suppress(OSError):
            while chunk := sock.recv(65536):
                got += chunk
    return int(got.split(b" ", 2)[1]) if got.startswith(b"HTTP/") else 0


def text_body(mb: float) -> bytes:
    prompt = "word " * int((mb * 1_000_000 - 100) / 5)
    return json.dumps({"model": "a", "prompt": prompt, "max_tokens": 1}).encode()


def ids_body(mb: float) -> bytes:
    ids, size, n = [], 40, 0
    while size < mb * 1_000_000 - 8:
        ids.append(n % 100_000)
        size += len(str(n % 100_000)) + 2
        n += 1
    return json.dumps({"model": "a", "prompt": ids, "max_tokens": 1}).encode()


def budget_of(url: str) -> dict[str, float]:
    """laned's request memory budget, from its /metrics (absent before issue 53)."""
    out = {}
    for line in httpx.get(f"{url}/metrics", timeout=10).text.splitlines():
        if line.startswith("laned_request_memory"):
            name, value = line.split()
            out[name] = float(value)
    return out


def phase(serve: LanedServe, count: int, body: bytes, workers: int) -> dict[str, Any]:
    statuses: dict[int, int] = {}
    began = time.monotonic()
    with (
        Watch(serve.process.pid, serve.url) as watch,
        concurrent.futures.ThreadPoolExecutor(workers) as pool,
    ):
        for status in pool.map(lambda _: post(serve.api, body), range(count)):
            statuses[status] = statuses.get(status, 0) + 1
    return {
        "bodies": count,
        "body_mb": round(len(body) / 1e6, 1),
        "seconds": round(time.monotonic() - began, 1),
        "statuses": dict(sorted(statuses.items())),
        **watch.figures(),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--bulk", type=int, default=128)
    parser.add_argument("--bulk-mb", type=float, default=15)
    parser.add_argument("--many", type=int, default=1000)
    parser.add_argument("--many-mb", type=float, default=1)
    parser.add_argument("--loop", type=int, default=64)
    parser.add_argument("--loop-mb", type=float, default=15)
    parser.add_argument("--loop-ids", action="store_true")
    parser.add_argument("--request-memory-mib", type=float)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    env = harness_env()
    unit = f"benchbudget{uuid.uuid4().hex[:6]}-a.service"
    out: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        api = free_port()
        limits = ""
        if args.request_memory_mib:
            limits = f"[daemon.limits]\nrequest_memory_mib = {args.request_memory_mib}\n"
        path = Path(tmp) / "laned.toml"
        path.write_text(
            f'[daemon]\nunit_dir = "{env["XDG_CONFIG_HOME"]}/systemd/user"\nbin_dir = "{tmp}/bin"\n'
            f'state_dir = "{tmp}/state"\nlisten = "127.0.0.1:{api}"\ndefault_lane = "a"\n'
            + limits
            + sim_lane("a", unit, free_port(), model=tmp)
        )
        with LanedServe(path, api, env, [unit], ready=1) as serve:
            out["rss_idle_mib"] = round(status_of(serve.process.pid, "VmRSS"), 1)
            out["budget"] = budget_of(serve.url)
            out["bulk"] = phase(serve, args.bulk, text_body(args.bulk_mb), args.bulk)
            out["many"] = phase(serve, args.many, text_body(args.many_mb), args.many)
            body = (ids_body if args.loop_ids else text_body)(args.loop_mb)
            out["loop"] = phase(serve, args.loop, body, args.loop)
            out["rss_after_mib"] = round(status_of(serve.process.pid, "VmRSS"), 1)
            out["budget_after"] = budget_of(serve.url)
        log = (path.parent / "laned.log").read_text()
        out["lost_the_user_bus"] = log.count("lost the user bus")
        out["tracebacks"] = log.count("Traceback")
    print(json.dumps(out, indent=2))
    if args.json:
        args.json.write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
