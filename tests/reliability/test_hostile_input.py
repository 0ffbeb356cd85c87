"""Hostile input at laned's OpenAI endpoint, which needs no token, against a real `laned
serve` with small `[daemon.limits]`: bodies over the limit (declared or chunked), a huge
header, half-sent and silent connections, more connections than one address may hold, JSON
nested past any parser — each refused in OpenAI's error shape with the limit named, laned's
memory flat under concurrent maximum bodies, its own reads answered meanwhile, and nothing
in its log but the refusals (no traceback)."""

from __future__ import annotations

import concurrent.futures
import contextlib
import json
import socket
import time
from pathlib import Path
from typing import Any

import httpx

from tests.helpers import free_port
from tests.integration.lanes import FAST
from tests.reliability.conftest import figures

MAX_BODY_MIB, HEAD_TIMEOUT, PER_CLIENT = 2, 1.0, 48
LIMITS = (
    f'limits = {{ max_body_mib = {MAX_BODY_MIB}, max_header_kib = 16, head_timeout = "{HEAD_TIMEOUT:g}s", '
    f'body_timeout = "2s", max_connections_per_client = {PER_CLIENT} }}\n'
)


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


def exchange(port: int, data: bytes, wait: float = 10.0) -> tuple[int, dict[str, Any], float]:
    """Send `data` as written; (status, JSON body, seconds until the connection closed)."""
    began = time.monotonic()
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.settimeout(wait)
        with contextlib.suppress(OSError):  # refused while sending: its answer is read below
            sock.sendall(data)
        got = b""
        while chunk := sock.recv(65536):
            got += chunk
    head, _, body = got.partition(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1]) if head else 0
    return status, json.loads(body) if body else {}, time.monotonic() - began


def limit_of(answer: dict[str, Any]) -> str:
    error = answer["error"]
    assert error["message"] and error["code"] and error["type"], answer
    return str(error["laned"]["limit"])


def test_hostile_input_is_bounded_and_answered_with_the_limit_named(daemon: Any) -> None:
    serve = daemon({"a": FAST}, daemon_toml='default_lane = "a"\n' + LIMITS, ports={"a": free_port()})  # fmt: skip
    port, pid = serve.api, serve.process.pid
    v1 = b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
    before = rss_mib(pid)

    # Eight concurrent bodies of 50 MB: refused by their length, never read.
    huge = 50 * 1024 * 1024
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        sent = list(pool.map(lambda _: exchange(port, v1 + b"Content-Length: %d\r\n\r\n" % huge + b"x" * 65536), range(8)))  # fmt: skip
    assert [status for status, _, _ in sent] == [413] * 8, sent
    assert {limit_of(answer) for _, answer, _ in sent} == {"max_body_mib"}
    # A chunked body that passes the limit as it comes.
    chunk = b"x" * (1024 * 1024)
    chunked = v1 + b"Transfer-Encoding: chunked\r\n\r\n" + (b"100000\r\n" + chunk + b"\r\n") * (MAX_BODY_MIB + 2)  # fmt: skip
    status, answer, _ = exchange(port, chunked)
    assert status == 413 and limit_of(answer) == "max_body_mib", answer
    # Eight concurrent bodies at the limit are read and answered (by the engine).
    prompt = "word " * ((MAX_BODY_MIB * 1024 * 1024 - 200) // 5)
    body = json.dumps({"model": "a", "prompt": prompt, "max_tokens": 1}).encode()
    assert len(body) <= MAX_BODY_MIB * 1024 * 1024
    with (
        httpx.Client(base_url=serve.url, timeout=60) as client,
        concurrent.futures.ThreadPoolExecutor(8) as pool,
    ):
        at_limit = list(pool.map(lambda _: client.post("/v1/completions", content=body).status_code, range(8)))  # fmt: skip
    assert all(code < 500 for code in at_limit), at_limit
    after = rss_mib(pid)

    # A 64 KB header.
    status, answer, _ = exchange(port, b"GET /lanes HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Big: " + b"a" * 65536 + b"\r\n\r\n")  # fmt: skip
    assert status == 431 and limit_of(answer) == "max_header_kib", answer
    # JSON nested past any parser: a client error, not laned's failure.
    nested = b"[" * 200_000
    status, answer, _ = exchange(port, v1 + b"Content-Length: %d\r\nConnection: close\r\n\r\n" % len(nested) + nested)  # fmt: skip
    assert status == 400 and answer["error"]["laned"]["limit"] == "json depth", answer

    # Half-sent heads and silent connections are answered 408 and closed, while laned's own
    # reads are answered.
    with concurrent.futures.ThreadPoolExecutor(40) as pool:
        slow = [pool.submit(exchange, port, b"GET /lanes HTTP/1.1\r\nHost: 127.0.0.1\r\n") for _ in range(20)]  # fmt: skip
        silent = [pool.submit(exchange, port, b"") for _ in range(15)]
        reads = []
        with httpx.Client(base_url=serve.url, timeout=10) as client:
            deadline = time.monotonic() + HEAD_TIMEOUT
            while time.monotonic() < deadline:
                began = time.monotonic()
                assert client.get("/lanes").status_code == 200
                reads.append(time.monotonic() - began)
        held = [f.result() for f in slow + silent]
    assert {status for status, _, _ in held} == {408}, held
    assert {limit_of(answer) for _, answer, _ in held} == {"head_timeout"}
    longest = max(seconds for _, _, seconds in held)
    assert longest < HEAD_TIMEOUT + 5, longest

    # One address holds at most PER_CLIENT connections; the next is answered 429.
    idle = [socket.create_connection(("127.0.0.1", port)) for _ in range(PER_CLIENT)]
    try:
        status, answer, _ = exchange(port, b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        assert status == 429 and limit_of(answer) == "max_connections_per_client", answer
    finally:
        for sock in idle:
            sock.close()
    with httpx.Client(base_url=serve.url, timeout=10) as client:
        deadline = time.monotonic() + 10
        while client.get("/healthz").status_code != 200:  # the count falls as they close
            assert time.monotonic() < deadline, "laned still refuses after the connections closed"
    log = (serve.path.parent / "laned.log").read_text()
    assert "Traceback" not in log, log[-3000:]
    figures("hostile-input", rss_before_mib=round(before, 1), rss_after_mib=round(after, 1),
            refused_50mb_bodies=len(sent), at_limit_bodies=len(at_limit), held_off=len(held),
            slowest_held_s=round(longest, 2), reads_meanwhile=len(reads),
            slowest_read_ms=round(max(reads) * 1000, 1))  # fmt: skip
    assert after - before < 8 * MAX_BODY_MIB * 4, (before, after)
