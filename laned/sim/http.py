"""A small HTTP/1.1 server on asyncio streams: keep-alive, Content-Length bodies, chunked SSE.

Just enough for what talks to a vLLM server: httpx, curl (including `Expect: 100-continue`),
Prometheus. Stdlib only, so the simulator runs on a bare Python inside its image. Like
vLLM's uvicorn, it closes a connection left idle for KEEP_ALIVE seconds after a response,
so clients that pool connections meet the same race they meet in production.
"""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import AsyncGenerator, Awaitable, Callable
from dataclasses import dataclass, field
from http import HTTPStatus
from typing import Any
from urllib.parse import parse_qs, urlsplit

MAX_BODY = 512 * 1024 * 1024  # long-context prompts are megabytes of text
KEEP_ALIVE = 5.0  # vLLM's api_server: TIMEOUT_KEEP_ALIVE = 5 (seconds), passed to uvicorn


@dataclass
class Request:
    """One parsed HTTP request."""

    method: str
    path: str
    query: dict[str, list[str]]
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        """The body as JSON (ValueError when it is not)."""
        return json.loads(self.body or b"null")


@dataclass
class Response:
    """A complete response, or a streamed one when `stream` is set."""

    status: int = 200
    body: bytes = b""
    content_type: str = "application/json"
    headers: dict[str, str] = field(default_factory=dict)
    stream: AsyncGenerator[bytes, None] | None = None
    after: Callable[[], None] | None = None  # runs once the response has been written

    @classmethod
    def json(cls, data: Any, status: int = 200) -> Response:
        """A JSON response."""
        return cls(status, json.dumps(data).encode(), "application/json")

    @classmethod
    def text(
        cls, text: str, status: int = 200, content_type: str = "text/plain; charset=utf-8"
    ) -> Response:
        """A text response."""
        return cls(status, text.encode(), content_type)


Handler = Callable[[Request], Awaitable[Response]]


async def _read_request(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, idle: float | None = None
) -> Request | None:
    """The next request; None when the client closed or sent nothing within `idle` seconds."""
    try:
        line = await asyncio.wait_for(reader.readline(), idle)
    except asyncio.TimeoutError:
        return None
    if not line:
        return None
    parts = line.decode("latin-1").strip().split()
    if len(parts) != 3:
        raise ValueError("malformed request line")
    method, target, _ = parts
    headers: dict[str, str] = {}
    while True:
        raw = await reader.readline()
        if raw in (b"\r\n", b"\n", b""):
            break
        name, _, value = raw.decode("latin-1").partition(":")
        headers[name.strip().lower()] = value.strip()
    length = int(headers.get("content-length", "0") or 0)
    if length > MAX_BODY:
        raise ValueError("request body too large")
    if headers.get("expect", "").lower() == "100-continue" and length:
        writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        await writer.drain()
    body = await reader.readexactly(length) if length else b""
    url = urlsplit(target)
    return Request(method.upper(), url.path, parse_qs(url.query), headers, body)


def _head(status: int, headers: dict[str, str]) -> bytes:
    reason = HTTPStatus(status).phrase if status in HTTPStatus._value2member_map_ else "Status"
    lines = [f"HTTP/1.1 {status} {reason}"] + [f"{k}: {v}" for k, v in headers.items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


def bind_socket(host: str, port: int) -> socket.socket:
    """Bind without listening, with SO_REUSEADDR and SO_REUSEPORT, as vLLM's
    create_server_socket does: connections are refused until the server listens."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    try:
        sock.bind((host, port))
    except OSError:
        sock.close()
        raise
    return sock


class Server:
    """Serves one handler; tracks connections so that shutdown can close them."""

    def __init__(self, handler: Handler, keep_alive: float = KEEP_ALIVE) -> None:
        self.handler = handler
        self.keep_alive = keep_alive
        self.server: asyncio.base_events.Server | None = None
        self.writers: set[asyncio.StreamWriter] = set()

    async def start(self, sock: socket.socket) -> None:
        """Listen on a socket bound earlier (bind_socket) and serve."""
        self.server = await asyncio.start_server(self._serve, sock=sock)

    async def close(self) -> None:
        """Stop listening and drop open connections."""
        if self.server is not None:
            self.server.close()
        for writer in list(self.writers):
            writer.close()
        if self.server is not None:
            await self.server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.writers.add(writer)
        idle: float | None = None  # the first request may take its time; later ones keep-alive
        try:
            while True:
                try:
                    request = await _read_request(reader, writer, idle)
                except (ValueError, asyncio.IncompleteReadError, UnicodeDecodeError) as exc:
                    await self._write(
                        writer, Response.json({"error": {"message": str(exc)}}, 400), close=True
                    )
                    return
                if request is None:
                    return
                response = await self.handler(request)
                close = request.headers.get("connection", "").lower() == "close"
                await self._write(writer, response, close)
                if response.after is not None:
                    response.after()
                if close:
                    return
                idle = self.keep_alive
        except (ConnectionError, asyncio.CancelledError):
            return
        finally:
            self.writers.discard(writer)
            writer.close()

    async def _write(self, writer: asyncio.StreamWriter, response: Response, close: bool) -> None:
        headers = {"content-type": response.content_type, **response.headers}
        if close:
            headers["connection"] = "close"
        if response.stream is None:
            headers["content-length"] = str(len(response.body))
            writer.write(_head(response.status, headers) + response.body)
            await writer.drain()
            return
        headers["transfer-encoding"] = "chunked"
        headers["cache-control"] = "no-cache"
        writer.write(_head(response.status, headers))
        await writer.drain()
        try:
            async for chunk in response.stream:
                writer.write(f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n")
                await writer.drain()
        finally:
            # A client that hangs up mid-stream aborts the request: let the generator know.
            await response.stream.aclose()
        writer.write(b"0\r\n\r\n")
        await writer.drain()
