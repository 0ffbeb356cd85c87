#!/usr/bin/env python3
"""The time laned adds to each streamed request, paired request by request, read off the
loopback's own packet timestamps (prints figures and writes JSON; asserts nothing):

    scripts/harness up && .venv/bin/python bench/proxy_latency.py [--concurrency 16] [--json FILE]

bench/proxy.py's added TTFT is the difference of two p99s taken a phase apart, the engine
reached directly and through laned: on a machine where the engine's own p99 moves by 20 ms
between phases, that difference measures the machine. Here each request is followed on both
of its legs at once — client -> laned, laned -> engine, and back — by a packet capture on
`lo` (an AF_PACKET socket in its own process, root needed; the kernel stamps each packet as
its sender writes it, SO_TIMESTAMPNS, so the capture's own delays do not count):

    added = (laned sends the request to the engine - the client's last request byte)
          + (laned sends the first event to the client - the engine sends it to laned)

Each request carries a marker in its prompt that finds it on both legs; on each connection
the first `data: ` after a request is that request's first event (HTTP/1.1: one request at a
time on a connection). `--concurrency` clients each send `--requests` streaming chats one
after another through laned, to one simulated lane, as bench/proxy.py does.
"""

from __future__ import annotations

import argparse
import asyncio
import ctypes
import json
import os
import random
import re
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import pct
from bench.proxy import one_lane

MARK = re.compile(rb"lat-(\d{6})")
SO_TIMESTAMPNS, SO_ATTACH_FILTER = 35, 26
PACKET_OUTGOING = 4
# Classic BPF: keep a packet as it is sent (on lo each is seen twice, sent and received).
# ld pkttype (SKF_AD_OFF + SKF_AD_PKTTYPE); jeq #4 ? accept : drop
_FILTER = [(0x30, 0, 0, 0xFFFFF004), (0x15, 0, 1, PACKET_OUTGOING), (0x06, 0, 0, 0xFFFF), (0x06, 0, 0, 0)]  # fmt: skip


def sniff(ports: set[int], out: Path) -> None:
    """Capture TCP payloads to or from `ports` on lo until SIGTERM: (ns, sport, dport,
    marker or -1, whether it holds `data: `), written to `out` as JSON at the end."""
    sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(0x0003))
    program = (ctypes.c_ubyte * (8 * len(_FILTER)))(*b"".join(struct.pack("HBBI", *i) for i in _FILTER))  # fmt: skip
    prog = struct.pack("HL", len(_FILTER), ctypes.addressof(program))
    sock.setsockopt(socket.SOL_SOCKET, SO_ATTACH_FILTER, prog)
    sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 << 20)
    sock.bind(("lo", 0))
    seen: list[tuple[int, int, int, int, bool]] = []
    stop = False

    def done(*_: Any) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, done)
    sock.settimeout(0.2)
    out.with_suffix(".ready").touch()
    while not stop:
        try:
            frame, anc, _flags, _addr = sock.recvmsg(65536, 64)
        except (TimeoutError, InterruptedError):
            continue
        if len(frame) < 34 or frame[12:14] != b"\x08\x00" or frame[23] != 6:  # IPv4, TCP
            continue
        ihl = (frame[14] & 0x0F) * 4
        tcp = 14 + ihl
        sport, dport = struct.unpack_from("!HH", frame, tcp)
        if sport not in ports and dport not in ports:
            continue
        payload = frame[tcp + (frame[tcp + 12] >> 4) * 4 :]
        if not payload:
            continue
        stamp = next(
            (s * 10**9 + ns for level, kind, data in anc if kind == SO_TIMESTAMPNS
             for s, ns in [struct.unpack("qq", data[:16])]),
            time.time_ns(),
        )  # fmt: skip
        mark = MARK.search(payload)
        seen.append((stamp, sport, dport, int(mark.group(1)) if mark else -1, b"data: " in payload))
    out.write_text(json.dumps(seen))


def added_times(seen: list[list[Any]], laned: int, engine: int) -> tuple[list[tuple[float, float]], int]:  # fmt: skip
    """Per request (its marker on both legs): laned's time in ms before it forwarded the
    request, and to relay its first event; and how many requests could not be followed on
    both legs."""
    requests: dict[int, dict[str, Any]] = {}
    replies: dict[tuple[int, int], list[int]] = {}  # (from, to) -> stamps of `data: ` packets
    for stamp, sport, dport, mark, data in sorted(seen):
        if mark >= 0 and dport in (laned, engine):
            leg = "client" if dport == laned else "engine"
            # The request's last packet with its marker: the body, its last byte.
            requests.setdefault(mark, {})[leg] = (stamp, sport)
        elif data and sport in (laned, engine):
            replies.setdefault((sport, dport), []).append(stamp)
    added, lost = [], 0
    for legs in requests.values():
        if set(legs) != {"client", "engine"}:
            lost += 1
            continue
        (sent, client_port), (forwarded, laned_port) = legs["client"], legs["engine"]
        first_in = next((s for s in replies.get((engine, laned_port), []) if s > forwarded), None)
        first_out = next((s for s in replies.get((laned, client_port), []) if s > sent), None)
        if first_in is None or first_out is None:
            lost += 1
            continue
        added.append(((forwarded - sent) / 1e6, (first_out - first_in) / 1e6))
    return added, lost


async def load(url: str, concurrency: int, requests: int, tokens: int) -> None:
    """`concurrency` clients, each `requests` streaming chats one after another."""
    draw = random.Random(7)
    limits = httpx.Limits(max_connections=concurrency * 2, keepalive_expiry=4)
    counter = iter(range(10**6))

    async def client_loop(client: httpx.AsyncClient) -> None:
        for _ in range(requests):
            body = {
                "model": "a", "max_tokens": draw.randint(tokens // 2, tokens * 3 // 2),
                "messages": [{"role": "user", "content": f"hello lat-{next(counter):06d}"}],
                "ignore_eos": True, "stream": True,
            }  # fmt: skip
            async with client.stream("POST", url, json=body) as sse:
                assert sse.status_code == 200, sse.status_code
                async for _line in sse.aiter_lines():
                    pass

    async with httpx.AsyncClient(timeout=120, limits=limits) as client:
        await asyncio.gather(*(client_loop(client) for _ in range(concurrency)))


async def bench(concurrency: int, requests: int, tokens: int, tps: float) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        capture = Path(tmp) / "capture.json"
        async with one_lane(tps, "benchlat") as (_laned, port, api_port):
            url = f"http://127.0.0.1:{api_port}/v1/chat/completions"
            await load(url, concurrency, 1, 8)  # warm: connections, code
            sniffer = subprocess.Popen(
                [sys.executable, __file__, "--sniff", str(api_port), str(port), str(capture)]
            )
            try:
                deadline = time.monotonic() + 10
                while not capture.with_suffix(".ready").exists():
                    assert time.monotonic() < deadline and sniffer.poll() is None, "no capture"
                    await asyncio.sleep(0.05)
                began = time.perf_counter()
                await load(url, concurrency, requests, tokens)
                wall = time.perf_counter() - began
            finally:
                sniffer.terminate()
                sniffer.wait(30)
        seen = json.loads(capture.read_text())
    parts, lost = added_times(seen, api_port, port)
    added = [a + b for a, b in parts]

    def spread(values: list[float]) -> dict[str, float]:
        return {q: round(pct(values, v), 3) for q, v in (("p50", 0.5), ("p90", 0.9), ("p99", 0.99))} | {"max": round(max(values), 3)}  # fmt: skip

    return {
        "concurrency": concurrency, "requests": concurrency * requests, "followed": len(added),
        "lost": lost, "wall_s": round(wall, 2), "cores": os.cpu_count(),
        "date": time.strftime("%Y-%m-%d"),
        "added_ms": spread(added),
        "before_forward_ms": spread([a for a, _ in parts]),
        "first_event_relay_ms": spread([b for _, b in parts]),
        "within_2ms": round(sum(a <= 2 for a in added) / len(added), 4),
    }  # fmt: skip


def main() -> None:
    if sys.argv[1:2] == ["--sniff"]:
        sniff({int(sys.argv[2]), int(sys.argv[3])}, Path(sys.argv[4]))
        return
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--requests", type=int, default=16, help="per client")
    parser.add_argument("--max-tokens", type=int, default=200, help="the mean (0.5x-1.5x)")
    parser.add_argument("--tps", type=float, default=100, help="simulated tokens/s per request")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    result = asyncio.run(bench(args.concurrency, args.requests, args.max_tokens, args.tps))
    added = result["added_ms"]
    print(
        f"laned's added time to first event, {result['followed']} of {result['requests']} requests "
        f"followed on both legs ({result['concurrency']} streams, {result['cores']} cores): "
        f"p50 {added['p50']:.3f} ms, p90 {added['p90']:.3f} ms, p99 {added['p99']:.3f} ms, "
        f"max {added['max']:.3f} ms; {result['within_2ms']:.2%} within 2 ms"
    )
    for part in ("before_forward_ms", "first_event_relay_ms"):
        print(f"  {part}: " + ", ".join(f"{q} {v:.3f}" for q, v in result[part].items()))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
