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
- a body not complete `body_timeout` after its head: 408, closed.

Reading stays paused while the application holds unread body (uvicorn's own flow control),
so at most `max_body_mib` of one request's body is ever buffered by laned.
"""

from __future__ import annotations

import asyncio
import json
import resource
from collections import Counter
from dataclasses import dataclass
from typing import Any

import httptools
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from laned.config.listener import LimitsConfig

MIB, KIB = 1024 * 1024, 1024
# Descriptors kept for laned itself beside its clients: the engines' pooled connections and
# probes, D-Bus, the journal, podman, state files.
RESERVED_FDS = 256
LINGER = 1.0  # seconds a refused connection's input is still read (and dropped) before it closes


@dataclass(frozen=True)
class Limits:
    """The listener's limits, in bytes, seconds and connections."""

    max_body: int
    max_head: int
    head_timeout: float
    body_timeout: float
    max_connections: int
    max_connections_per_client: int

    @staticmethod
    def of(config: LimitsConfig, nofile: int | None = None) -> Limits:
        """The limits a config asks for; `max_connections` kept below the file-descriptor
        limit less what laned keeps for itself."""
        soft = nofile if nofile is not None else resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        room = max(16, soft - RESERVED_FDS) if soft != resource.RLIM_INFINITY else 1 << 20
        total = min(config.max_connections, room)
        return Limits(
            max_body=int(config.max_body_mib * MIB),
            max_head=int(config.max_header_kib * KIB),
            head_timeout=config.head_timeout,
            body_timeout=config.body_timeout,
            max_connections=total,
            max_connections_per_client=min(config.max_connections_per_client, total),
        )


REASONS = {
    408: b"Request Timeout",
    413: b"Content Too Large",
    429: b"Too Many Requests",
    431: b"Request Header Fields Too Large",
}
KINDS = {
    408: "RequestTimeoutError",
    413: "RequestTooLargeError",
    429: "RateLimitError",
    431: "RequestTooLargeError",
}


def refusal(status: int, message: str, limit: str) -> bytes:
    """A whole HTTP answer in OpenAI's error shape, the limit named, the connection closed."""
    body = json.dumps(
        {
            "error": {
                "message": message,
                "type": KINDS[status],
                "param": None,
                "code": status,
                "laned": {
                    "limit": limit,
                    "hint": f"raise daemon.limits.{limit} if this is a real client's need",
                },
            }
        }
    ).encode()
    head = b"HTTP/1.1 %d %s\r\n" % (status, REASONS[status])
    fields = b"content-type: application/json\r\ncontent-length: %d\r\nconnection: close\r\n"
    return head + fields % len(body) + b"\r\n" + body


class _Refused(Exception):
    """Raised from a parser callback to stop parsing a refused request."""


def bounded(limits: Limits) -> type[HttpToolsProtocol]:
    """uvicorn's httptools protocol with `limits` (one class per listener: its connection
    counts are shared by the listener's connections)."""
    per_client: Counter[str] = Counter()
    open_now: list[int] = [0]

    class Bounded(HttpToolsProtocol):
        _timer: asyncio.TimerHandle | None = None
        _head = 0
        _body = 0
        _counted: str | None = None
        _refused = False
        _whole = False  # the current request's body is all in

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            address = self.client[0] if self.client else ""
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
                    f"{address or 'this client'} holds {limits.max_connections_per_client} connections to laned, the limit for one address",
                    "max_connections_per_client",
                )
                return
            per_client[address] += 1
            open_now[0] += 1
            self._counted = address
            self._arm(limits.head_timeout, "the request's head", "head_timeout")

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
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

        # --- the head ---------------------------------------------------------------------

        def on_message_begin(self) -> None:
            super().on_message_begin()
            self._head = self._body = 0
            self._whole = False
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
            declared = _content_length(self.headers)
            if declared is not None and declared > limits.max_body:
                self._refuse(
                    413,
                    f"the body is {declared} bytes, over laned's limit of {limits.max_body}",
                    "max_body_mib",
                )
                raise _Refused
            super().on_headers_complete()
            self._arm(limits.body_timeout, "the request's body", "body_timeout")

        # --- the body ---------------------------------------------------------------------

        def on_body(self, body: bytes) -> None:
            self._body += len(body)
            if self._body > limits.max_body:
                self._refuse(
                    413, f"the body passed laned's limit of {limits.max_body} bytes", "max_body_mib"
                )
                raise _Refused
            super().on_body(body)

        def on_message_complete(self) -> None:
            self._disarm()
            self._whole = True
            super().on_message_complete()

        def on_response_complete(self) -> None:
            if self._whole:  # else the body's deadline still runs: answered is not received
                self._disarm()  # the keep-alive timer takes over until the next request's head
            super().on_response_complete()

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

        def _refuse(self, status: int, message: str, limit: str) -> None:
            """Answer `status` unless an answer is under way, then close."""
            if self._refused or self.transport.is_closing():
                return
            self._refused = True
            self._disarm()
            cycle: Any = self.cycle
            in_flight = cycle is not None and not cycle.response_complete
            if not in_flight or not cycle.response_started:
                self.transport.write(refusal(status, message, limit))
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


def _content_length(headers: list[tuple[bytes, bytes]]) -> int | None:
    for name, value in headers:
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None
