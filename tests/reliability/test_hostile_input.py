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


def rss_mib(pid: int, field: str = "VmRSS") -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    raise AssertionError(f"no {field}")


def exchange(
    port: int, data: bytes, wait: float = 10.0, source: str = "127.0.0.1"
) -> tuple[int, dict[str, Any], float]:
    """Send `data` as written (from `source`); (status, JSON body, seconds until the
    connection closed)."""
    began = time.monotonic()
    with socket.create_connection(("127.0.0.1", port), source_address=(source, 0)) as sock:
        sock.settimeout(wait)
        with contextlib.suppress(OSError):  # refused while sending: its answer is read below
            sock.sendall(data)
        got = b""
        with contextlib.suppress(ConnectionResetError):
            while chunk := sock.recv(65536):
                got += chunk
    head, _, body = got.partition(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1]) if head else 0
    answer = json.loads(body) if body else {}
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.lower() == b"retry-after":
            answer["retry-after"] = value.strip().decode()
    return status, answer, time.monotonic() - began


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
    nested = b'{"model": "a", "prompt": ' + b"[" * 200_000 + b"}"  # read in the body parser
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

    # One client holds at most PER_CLIENT connections; the next is answered 429, also from
    # another of the host's loopback addresses (they are one client).
    idle = [socket.create_connection(("127.0.0.1", port)) for _ in range(PER_CLIENT)]
    try:
        healthz = b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
        status, answer, _ = exchange(port, healthz, source="127.0.0.2")
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


BODY_MIB, BUDGET_MIB = 2, 16
BUDGET = (
    f"limits = {{ max_body_mib = {BODY_MIB}, max_header_kib = 16, request_memory_mib = {BUDGET_MIB}, "
    'request_memory_wait = "2s", body_timeout = "60s" }\n'
)
V1 = b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"


def budget(url: str) -> dict[str, float]:
    """laned's request memory budget now, from its /metrics."""
    text = httpx.get(f"{url}/metrics", timeout=10).text
    return {
        name: float(value)
        for name, value in (line.split() for line in text.splitlines() if line.startswith("laned_request_memory"))
    }  # fmt: skip


def until(what: str, check: Any, seconds: float = 10) -> None:
    deadline = time.monotonic() + seconds
    while not check():
        assert time.monotonic() < deadline, what
        time.sleep(0.02)


def status_of(sock: socket.socket) -> int:
    got = b""
    while not got.endswith(b"}") and (chunk := sock.recv(65536)):
        got += chunk
    return int(got.split(b" ", 2)[1])


def test_requests_in_flight_share_one_memory_budget_and_a_head_is_bounded_as_it_comes(
    daemon: Any,
) -> None:
    serve = daemon({"a": FAST}, daemon_toml='default_lane = "a"\n' + BUDGET, ports={"a": free_port()})  # fmt: skip
    port, pid = serve.api, serve.process.pid
    assert budget(serve.url)["laned_request_memory_limit_bytes"] == BUDGET_MIB * 2**20

    # A header value of 32 MB is refused as it comes, not held whole until it ends.
    hwm = rss_mib(pid, "VmHWM")
    value = b"a" * (32 * 1024 * 1024)
    status, answer, _ = exchange(port, b"GET /lanes HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Big: " + value + b"\r\n\r\n")  # fmt: skip
    assert status == 431 and limit_of(answer) == "max_header_kib", answer
    header_rise = rss_mib(pid, "VmHWM") - hwm
    assert header_rise < 8, header_rise  # 32 MB held would show

    prompt = "word " * ((BODY_MIB * 2**20 - 200) // 5)
    body = json.dumps({"model": "a", "prompt": prompt, "max_tokens": 1}).encode()
    claim = 2 * len(body)  # each body byte counts twice (it and its copy to the engine)
    head = V1 + b"Content-Length: %d\r\nConnection: close\r\n\r\n" % len(body)

    # Four requests send their heads and hold back their bodies: the budget is full.
    holding = [socket.create_connection(("127.0.0.1", port)) for _ in range(4)]
    for sock in holding:
        sock.sendall(head)
    until("four claims held", lambda: budget(serve.url)["laned_request_memory_bytes"] == 4 * claim)
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        # A fifth waits, its body unread, until one of the four is gone (its client closed).
        fifth = pool.submit(exchange, port, head + body, 30.0)
        until("the fifth waits", lambda: budget(serve.url)["laned_request_memory_waiting"] == 1)
        holding[0].close()
        assert fifth.result()[0] < 500
        holding[1].sendall(body)  # one that sends its body is answered by the engine
        assert status_of(holding[1]) < 500
        holding[1].close()
        # The budget full again: a sixth finds no room within request_memory_wait.
        for i in (0, 1):
            holding[i] = socket.create_connection(("127.0.0.1", port))
            holding[i].sendall(head)
        until("full again", lambda: budget(serve.url)["laned_request_memory_bytes"] == 4 * claim)
        status, answer, waited = exchange(port, head + body, 30.0)
    assert status == 503 and limit_of(answer) == "request_memory_mib", answer
    assert answer["retry-after"] == "1" and answer["error"]["laned"]["retry_after"] == 1
    assert waited >= 2.0, waited  # it waited request_memory_wait first
    for sock in holding:
        sock.close()
    until("every byte given back", lambda: budget(serve.url)["laned_request_memory_bytes"] == 0)

    # 32 bodies at the limit at once: each answered by the engine, or 503 for want of room;
    # laned's memory within the budget (without it, 32 x 2 MiB twice over: 128 MiB).
    hwm = rss_mib(pid, "VmHWM")
    with concurrent.futures.ThreadPoolExecutor(32) as pool:
        storm = list(pool.map(lambda _: exchange(port, head + body, 60.0)[0], range(32)))
    storm_rise = rss_mib(pid, "VmHWM") - hwm
    assert set(storm) <= {400, 503} and 400 in storm, storm  # 400: the engine's (too long)
    assert storm_rise < BUDGET_MIB + 24, storm_rise
    after = budget(serve.url)
    assert after["laned_request_memory_bytes"] == 0 and after["laned_request_memory_waiting"] == 0
    assert after["laned_request_memory_refusals_total"] == 1 + storm.count(503)
    log = (serve.path.parent / "laned.log").read_text()
    assert "Traceback" not in log, log[-3000:]
    figures("request-budget", header_hwm_rise_mib=round(header_rise, 1),
            storm=len(storm), storm_503=storm.count(503), storm_hwm_rise_mib=round(storm_rise, 1),
            waited_s=round(waited, 2))  # fmt: skip
