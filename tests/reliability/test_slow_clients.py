"""Bad callers do not block good ones: while 20 connections sit half-open (nothing sent), 20
send a request's headers and then trickle its body, and one posts a 10 MB body to the OpenAI
endpoint, every `GET /lanes` of another caller is answered, and the 10 MB request gets the
engine's own answer (a prompt over the model's length: 400)."""

from __future__ import annotations

import asyncio
import json
import socket
import time
from typing import Any

import httpx

from tests.helpers import free_port
from tests.integration.lanes import FAST
from tests.reliability.conftest import figures


def test_half_open_slow_and_huge_requests_do_not_block_other_callers(daemon: Any) -> None:
    serve = daemon({"a": FAST}, daemon_toml='default_lane = "a"\n', ports={"a": free_port()})
    host, port = "127.0.0.1", serve.api
    idle = [socket.create_connection((host, port)) for _ in range(20)]
    slow = []
    for _ in range(20):
        sock = socket.create_connection((host, port))
        sock.sendall(
            b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            b'Content-Length: 100000\r\n\r\n{"model": "a", "prompt": "'
        )
        slow.append(sock)
    big = json.dumps({"model": "a", "prompt": "word " * 2_000_000, "max_tokens": 1}).encode()
    assert len(big) >= 10_000_000

    async def callers() -> tuple[list[int], int, float]:
        async with httpx.AsyncClient(base_url=serve.url, timeout=60) as client:
            huge = asyncio.ensure_future(
                client.post(
                    "/v1/completions", content=big, headers={"Content-Type": "application/json"}
                )
            )
            codes, slowest = [], 0.0
            for _ in range(20):
                for sock in slow:
                    sock.sendall(b"x")  # a byte now and then: the body never ends
                start = time.monotonic()
                codes.append((await client.get("/lanes")).status_code)
                slowest = max(slowest, time.monotonic() - start)
                await asyncio.sleep(0.05)
            return codes, (await huge).status_code, slowest

    try:
        codes, huge, slowest = asyncio.run(callers())
    finally:
        for sock in idle + slow:
            sock.close()
    assert codes == [200] * 20
    assert huge == 400  # the engine's answer to a prompt over max_model_len, passed through
    assert httpx.get(f"{serve.url}/healthz", timeout=10).status_code == 200
    figures("bad-callers", half_open=len(idle), trickling=len(slow), body_mb=round(len(big) / 1e6, 1),
            reads_answered=len(codes), slowest_read_s=round(slowest, 3), huge_request_answer=huge)  # fmt: skip
