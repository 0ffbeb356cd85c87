"""Bounded input at laned's listener: what one request may send, how long it may take to
send it, and how many connections may be open (`[daemon.limits]`, docs/configuration.md).

uvicorn's httptools protocol bounds none of these: it keeps every header byte a client
sends, waits forever for a connection's first byte and for the rest of a half-sent request,
and accepts connections up to the file-descriptor limit. `bounded(limits)` is that protocol
with the limits (uvicorn takes it as `http=`), each refusal answered before the application
runs, in the OpenAI error shape with the limit named (laned's OpenAI endpoint needs no token,
so these are what stand between any local process and laned's memory):

- a connection beyond `max_connections`, or beyond `max_connections_per_client` from one
  address: 429, closed;
- a request head (line and headers) over `max_header_kib`: 431, closed;
- a head not complete `head_timeout` after the connection opened or its last answer ended
  (a slow or silent client): 408, closed;
- a body over `max_body_mib` (by its Content-Length before it is read, or as it comes): 413;
- a body not complete `body_timeout` after its head: 408, closed;
- a body that finds no room in the memory budget of all requests in flight
  (`request_memory_mib`, laned.api.budget) within `request_memory_wait`, or finds
  MAX_WAITING requests waiting already: 503 with Retry-After, closed. 503, not 429: the
  client did nothing wrong and was not rate-limited; the server is full for a moment
  (RFC 9110 15.6.4), and OpenAI's clients retry both after Retry-After.

Connections are counted per client by address, with the addresses of one host counted as one
(all of 127.0.0.0/8 and ::1 are this host; an IPv6 client by its /64, the prefix one host is
given), beside the count of all of them.

Reading stays paused while the application holds unread body (uvicorn's own flow control),
and while a request waits for room in the budget, so at most `max_body_mib` of one request's
body is ever buffered by laned, and the bodies of all requests together stay within the
budget (what the listener read with each waiting request's head aside: one socket read each).
A request's head is counted as it arrives, before the parser has it whole (httptools keeps a
header's value until it ends: a 64 MB value was buffered whole before its 431).
"""

from __future__ import annotations

import asyncio
import ipaddress
import json
import resource
from collections import Counter
from dataclasses import dataclass
from typing import Any

import httptools
from uvicorn.protocols.http.flow_control import FlowControl
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from laned.api.budget import Budget, Claim, default_capacity
from laned.config.listener import BODY_COPIES as COPIES
from laned.config.listener import LimitsConfig

MIB, KIB = 1024 * 1024, 1024
# Descriptors kept for laned itself beside its clients: the engines' pooled connections and
# probes, D-Bus, the journal, podman, state files.
RESERVED_FDS = 256
LINGER = 1.0  # seconds a refused connection's input is still read (and dropped) before it closes
# A chunked body (no Content-Length) claims the budget this much at a time as it comes.
CHUNKED_STEP = 1 * MIB
RETRY_AFTER = 1  # seconds, for a request refused for want of room in the budget
# The scope extension under which a request's budget claim is handed to the application,
# which gives it back as soon as the body has gone (laned.api.proxy).
BUDGET_KEY = "laned.budget"
WHO = {"loopback": "this host (its loopback addresses, counted as one client)", "": "this client"}


@dataclass(frozen=True)
class Limits:
    """The listener's limits, in bytes, seconds and connections."""

    max_body: int
    max_head: int
    head_timeout: float
    body_timeout: float
    max_connections: int
    max_connections_per_client: int
    request_memory: int = 256 * MIB
    request_memory_wait: float = 5.0

    @staticmethod
    def of(config: LimitsConfig, nofile: int | None = None, memory: int | None = None) -> Limits:
        """The limits a config asks for; `max_connections` kept below the file-descriptor
        limit less what laned keeps for itself; the request memory budget sized from
        `memory` (the bytes laned may use: the host's, or its cgroup's limit) unless the
        config gives it, and never below what one body at the limit claims."""
        soft = nofile if nofile is not None else resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        room = max(16, soft - RESERVED_FDS) if soft != resource.RLIM_INFINITY else 1 << 20
        total = min(config.max_connections, room)
        max_body = int(config.max_body_mib * MIB)
        if config.request_memory_mib is not None:
            budget = int(config.request_memory_mib * MIB)
        else:
            budget = max(default_capacity(memory), COPIES * max_body)
        return Limits(
            max_body=max_body,
            max_head=int(config.max_header_kib * KIB),
            head_timeout=config.head_timeout,
            body_timeout=config.body_timeout,
            max_connections=total,
            max_connections_per_client=min(config.max_connections_per_client, total),
            request_memory=budget,
            request_memory_wait=config.request_memory_wait,
        )


def client_of(address: str) -> str:
    """The client a connection is counted against: its address, but every loopback address
    as one (127.0.0.0/8 and ::1 are all this host) and an IPv6 address by its /64."""
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return address  # a Unix socket's path, or nothing
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    if ip.is_loopback:
        return "loopback"
    if isinstance(ip, ipaddress.IPv6Address):
        return str(ipaddress.IPv6Network((ip, 64), strict=False))
    return str(ip)


REASONS = {
    408: b"Request Timeout",
    413: b"Content Too Large",
    429: b"Too Many Requests",
    431: b"Request Header Fields Too Large",
    503: b"Service Unavailable",
}
KINDS = {
    408: "RequestTimeoutError",
    413: "RequestTooLargeError",
    429: "RateLimitError",
    431: "RequestTooLargeError",
    503: "ServiceUnavailableError",
}


def refusal(status: int, message: str, limit: str, retry_after: int | None = None) -> bytes:
    """A whole HTTP answer in OpenAI's error shape, the limit named, the connection closed."""
    laned: dict[str, Any] = {
        "limit": limit,
        "hint": f"raise daemon.limits.{limit} if this is a real client's need",
    }
    if retry_after is not None:
        laned["retry_after"] = retry_after
        laned["hint"] = (
            f"try again after {retry_after} s; {laned['hint']} (it is shared by every request)"
        )
    error = {"message": message, "type": KINDS[status], "param": None, "code": status}
    body = json.dumps({"error": {**error, "laned": laned}}).encode()
    head = b"HTTP/1.1 %d %s\r\n" % (status, REASONS[status])
    fields = b"content-type: application/json\r\ncontent-length: %d\r\nconnection: close\r\n"
    if retry_after is not None:
        fields += b"retry-after: %d\r\n" % retry_after
    return head + fields % len(body) + b"\r\n" + body


class _Flow(FlowControl):
    """uvicorn's flow control, with reading held while the request waits for the budget
    (the application's `receive` resumes reading whenever it wants more body)."""

    held = False

    def resume_reading(self) -> None:
        if not self.held:
            super().resume_reading()


class _Refused(Exception):
    """Raised from a parser callback to stop parsing a refused request."""


def bounded(limits: Limits, budget: Budget | None = None) -> type[HttpToolsProtocol]:
    """uvicorn's httptools protocol with `limits` (one class per listener: its connection
    counts are shared by the listener's connections, and `budget`, the memory of requests in
    flight, by every connection of the process)."""
    per_client: Counter[str] = Counter()
    open_now: list[int] = [0]
    shared = budget if budget is not None else Budget(limits.request_memory)

    class Bounded(HttpToolsProtocol):
        budget = shared
        _timer: asyncio.TimerHandle | None = None
        _waiting: asyncio.TimerHandle | None = None  # a request waiting for the budget
        _head = 0
        _body = 0
        _seen = 0  # bytes received since the current head began, while it is not whole
        _in_head = True
        _counted: str | None = None
        _refused = False
        _whole = False  # the current request's body is all in
        _chunked = False
        _claim: Claim | None = None

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            self.flow = _Flow(transport)
            self._claims: list[tuple[Any, Claim]] = []  # each request's claim, by its cycle
            address = client_of(self.client[0] if self.client else "")
            if open_now[0] >= limits.max_connections:
                self._refuse(
                    429,
                    f"laned holds {limits.max_connections} connections, its limit",
                    "max_connections",
                )
                return
            if per_client[address] >= limits.max_connections_per_client:
                self._refuse(
                    429,
                    f"{WHO.get(address, address)} holds {limits.max_connections_per_client} connections to laned, the limit for one client",
                    "max_connections_per_client",
                )
                return
            per_client[address] += 1
            open_now[0] += 1
            self._counted = address
            self._arm(limits.head_timeout, "the request's head", "head_timeout")

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            self._stop_waiting()
            for _, claim in self._claims:
                claim.release()
            self._claims.clear()
            if self._counted is not None:
                per_client[self._counted] -= 1
                if per_client[self._counted] <= 0:
                    del per_client[self._counted]
                open_now[0] -= 1
                self._counted = None
            super().connection_lost(exc)

        def data_received(self, data: bytes) -> None:
            # uvicorn's own, but a request refused from a callback is answered already.
            if self._refused:
                return
            if self._in_head and self._seen > limits.max_head:
                # What came before this read was all head and passed the limit already: the
                # parser holds a header's value until it ends, so it is refused here.
                self._refuse(
                    431,
                    f"the request's head passed laned's limit of {limits.max_head} bytes",
                    "max_header_kib",
                )
                return
            self._unset_keepalive_if_required()
            try:
                self.parser.feed_data(data)
            except httptools.HttpParserUpgrade:
                if self._should_upgrade():
                    self.handle_websocket_upgrade()
                else:
                    self._unsupported_upgrade_warning()
            except httptools.HttpParserError:
                if not self._refused:
                    self.logger.warning("Invalid HTTP request received.")
                    self.send_400_response("Invalid HTTP request received.")
                return
            if self._in_head:
                self._seen += len(data)

        # --- the head ---------------------------------------------------------------------

        def on_message_begin(self) -> None:
            super().on_message_begin()
            self._head = self._body = self._seen = 0
            self._in_head = True
            self._whole = self._chunked = False
            self._claim = None
            if self._timer is None:  # a keep-alive connection's next request
                self._arm(limits.head_timeout, "the request's head", "head_timeout")

        def on_url(self, url: bytes) -> None:
            self._count_head(len(url))
            super().on_url(url)

        def on_header(self, name: bytes, value: bytes) -> None:
            self._count_head(len(name) + len(value) + 4)
            super().on_header(name, value)

        def on_headers_complete(self) -> None:
            self._disarm()
            self._in_head = False
            declared = _content_length(self.headers)
            if declared is not None and declared > limits.max_body:
                self._refuse(
                    413,
                    f"the body is {declared} bytes, over laned's limit of {limits.max_body}",
                    "max_body_mib",
                )
                raise _Refused
            self._chunked = declared is None and _chunked(self.headers)
            size = CHUNKED_STEP if self._chunked else declared or 0
            if size:
                self._claim = self.budget.claim(COPIES * size, self._granted)
                if self._claim is None:
                    self._refuse_for_room(f"{self.budget.waiting()} requests wait already")
                    raise _Refused
                if self._claim.pending:
                    self._hold()
                self.scope.setdefault("extensions", {})[BUDGET_KEY] = self._claim
            super().on_headers_complete()
            if self._claim is not None:
                self._claims.append((self.cycle, self._claim))
            self._arm(limits.body_timeout, "the request's body", "body_timeout")

        # --- the body ---------------------------------------------------------------------

        def on_body(self, body: bytes) -> None:
            self._body += len(body)
            if self._body > limits.max_body:
                self._refuse(
                    413, f"the body passed laned's limit of {limits.max_body} bytes", "max_body_mib"
                )
                raise _Refused
            claim = self._claim
            beyond = claim is not None and COPIES * self._body > claim.size + claim.pending
            if (
                self._chunked
                and beyond
                and claim is not None
                and not claim.grow(COPIES * CHUNKED_STEP)
            ):
                self._hold()
            super().on_body(body)

        def on_message_complete(self) -> None:
            self._disarm()
            self._whole = True
            super().on_message_complete()

        def on_response_complete(self) -> None:
            if self._whole:  # else the body's deadline still runs: answered is not received
                self._disarm()  # the keep-alive timer takes over until the next request's head
            done = [pair for pair in self._claims if pair[0].response_complete]
            for pair in done:
                pair[1].release()
                self._claims.remove(pair)
            super().on_response_complete()

        # --- the budget -------------------------------------------------------------------

        def _hold(self) -> None:
            """Read no more of this connection until the budget has room for its body, for
            up to request_memory_wait."""
            self.flow.held = True  # type: ignore[attr-defined]
            self.flow.pause_reading()
            if self._waiting is None:
                self._waiting = self.loop.call_later(
                    limits.request_memory_wait,
                    self._refuse_for_room,
                    f"no room came within request_memory_wait ({limits.request_memory_wait:g} s)",
                )

        def _granted(self) -> None:
            self._stop_waiting()
            self.flow.held = False  # type: ignore[attr-defined]
            if not self._refused:
                self.flow.resume_reading()

        def _stop_waiting(self) -> None:
            if self._waiting is not None:
                self._waiting.cancel()
                self._waiting = None

        def _refuse_for_room(self, why: str) -> None:
            self._waiting = None
            self.budget.refused += 1
            held = self.budget.held / MIB
            self._refuse(
                503,
                f"laned holds {held:.0f} MiB of requests in flight, its budget is "
                f"{limits.request_memory / MIB:.0f} MiB, and {why}",
                "request_memory_mib",
                retry_after=RETRY_AFTER,
            )

        # --- refusals ---------------------------------------------------------------------

        def _count_head(self, size: int) -> None:
            self._head += size
            if self._head > limits.max_head:
                self._refuse(
                    431,
                    f"the request's head passed laned's limit of {limits.max_head} bytes",
                    "max_header_kib",
                )
                raise _Refused

        def _arm(self, seconds: float, what: str, limit: str) -> None:
            self._disarm()
            self._timer = self.loop.call_later(seconds, self._late, what, seconds, limit)

        def _disarm(self) -> None:
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None

        def _late(self, what: str, seconds: float, limit: str) -> None:
            self._timer = None
            self._refuse(408, f"{what} did not arrive within {seconds:g}s", limit)

        def _refuse(
            self, status: int, message: str, limit: str, retry_after: int | None = None
        ) -> None:
            """Answer `status` unless an answer is under way, then close."""
            if self._refused or self.transport.is_closing():
                return
            self._refused = True
            self._disarm()
            self._stop_waiting()
            self.flow.held = False  # type: ignore[attr-defined]
            self.flow.resume_reading()  # the lingering close below reads what still comes
            for _, claim in self._claims:
                claim.release()
            self._claims.clear()
            if self._claim is not None:
                self._claim.release()  # refused before its cycle began
            cycle: Any = self.cycle
            in_flight = cycle is not None and not cycle.response_complete
            if not in_flight or not cycle.response_started:
                self.transport.write(refusal(status, message, limit, retry_after))
            if in_flight:
                # The application's receive() says the client is gone, its send() is dropped.
                cycle.response_started = cycle.response_complete = cycle.disconnected = True
                cycle.message_event.set()
            # A lingering close: what the client still sends is read and dropped for a moment,
            # so that its kernel does not reset the connection before it reads the answer.
            if self.transport.can_write_eof():
                self.transport.write_eof()
                self.loop.call_later(LINGER, self.transport.close)
            else:
                self.transport.close()

    return Bounded


def _chunked(headers: list[tuple[bytes, bytes]]) -> bool:
    return any(
        name == b"transfer-encoding" and b"chunked" in value.lower() for name, value in headers
    )


def _content_length(headers: list[tuple[bytes, bytes]]) -> int | None:
    for name, value in headers:
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None
