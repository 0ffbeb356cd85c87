"""The proxy's connections to the engines: HTTP/1.1 over asyncio protocols, parsed by httptools.

laned's OpenAI endpoint relays an engine's answer chunk by chunk; at one stream each chunk
of an SSE answer is its own wakeup, so what the client does per chunk is most of laned's
cost per token (bench/proxy_cost.py). Here a chunk is one `data_received`, one C parse and
the relay's `send` made right there (Answer.pour): no task woken, no stream reader, no
payload parser of a general client (docs/decisions/0008-own-upstream-client.md says what was
measured against aiohttp, 0009 what pour saves).

A connection is kept for the next request when its answer was read to the end and the engine
did not say `Connection: close`; it is given up after half the engine's idle timeout
(uvicorn closes an idle connection after 5 s: a request sent just as it does would fail).
An answer whose body the relay stops reading (the client went away) closes its connection:
vLLM aborts a request whose connection closes.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Generator, Iterable
from typing import Any, cast

import httptools

from laned.adapters.probes import ENGINE_KEEP_ALIVE
from laned.errors import EngineBrokeOff

IDLE = ENGINE_KEEP_ALIVE / 2  # seconds a connection waits in the pool for its next request
HIGH_WATER = 1 << 20  # bytes of an answer held before the engine's socket is read no more
CONNECT_TIMEOUT = 5.0


# Hands a piece of the body on (the relay: an ASGI `send` of it). Called from the engine
# connection's data_received and stepped there; see Answer.pour.
Deliver = Callable[[bytes], Awaitable[None]]
# A request body up to this size goes out in one write with its head; a larger one is
# written apart (joining would copy it: a body at the listener's limit is 16 MiB).
ONE_WRITE = 64 * 1024


class _Rest:
    """The rest of a delivery that was stepped once and is waiting on `awaited` (a future,
    as `await` yields it): awaited, it waits for that, then runs the delivery to its end,
    as if it had been awaited from its start."""

    def __init__(self, delivery: Any, awaited: Any) -> None:
        self.delivery, self.awaited = delivery, awaited

    def close(self) -> None:
        self.delivery.close()

    def __await__(self) -> Generator[Any, None, None]:
        try:
            yield self.awaited  # the relay's task waits for what the delivery waits for
        except BaseException:
            self.delivery.close()
            raise
        yield from self.delivery.__await__()


class Answer:
    """One engine answer: its status and headers, then its body as it comes."""

    def __init__(self, conn: _Connection) -> None:
        self._conn = conn
        self.status = 0
        self.headers: list[tuple[bytes, bytes]] = []  # names lowercased, values as sent
        self._parts: list[bytes] = []
        self._held = 0
        self._done = False  # the whole body was read from the engine
        self._error: BaseException | None = None
        self._waiter: asyncio.Future[None] | None = None
        self._ended = False
        self._deliver: Deliver | None = None
        self._eager = False  # pour waits: a piece is delivered as it arrives
        self._pending: _Rest | asyncio.Future[Any] | None = None  # a delivery not done at once

    def at_eof(self) -> bool:
        """Whether the whole body has come and been taken."""
        return self._done and not self._parts

    async def chunk(self) -> bytes:
        """What has come of the body since the last call (waiting for something when nothing
        has), b"" at its end; EngineBrokeOff when the engine's connection ends first."""
        while not self._parts:
            if self._done:
                return b""
            if self._error is not None:
                raise self._error
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        parts, self._parts, self._held = self._parts, [], 0
        self._conn.resume()
        return parts[0] if len(parts) == 1 else b"".join(parts)

    async def pour(self, deliver: Deliver) -> None:
        """Hand the whole body to `deliver` as it comes; return at its end (EngineBrokeOff
        when the engine's connection ends first, or the answer is given up).

        While this waits, each piece is delivered from the connection's data_received, in the
        loop's turn that brought its bytes: the relay's task does not wake for it (with
        `chunk` it did, and at one stream that wakeup is most of laned's cost a token:
        bench/proxy_cost.py). `deliver` is called there and stepped once: uvicorn's `send`
        writes to the client's socket and ends at once unless that socket is full. A
        delivery that does not end at once is finished here, by the relay's task, with the
        engine's socket held (not read) until it has; pieces that came meanwhile follow it.
        A delivery that waits ends when the client goes away (uvicorn's `send` does), and
        pour with it."""
        self._deliver = deliver
        try:
            while True:
                if self._pending is not None:
                    rest, self._pending = self._pending, None
                    await rest
                    self._conn.resume()
                elif self._parts:  # came before pour began, or while a delivery waited
                    self._conn.resume()
                    self._push()
                elif self._error is not None:
                    raise self._error
                elif self._done:
                    return
                else:
                    self._waiter = asyncio.get_running_loop().create_future()
                    self._eager = True
                    try:
                        await self._waiter
                    finally:
                        self._waiter, self._eager = None, False
        finally:
            self._deliver = None

    async def read(self) -> bytes:
        """The rest of the body."""
        parts = []
        while piece := await self.chunk():
            parts.append(piece)
        return b"".join(parts)

    def end(self) -> None:
        """Done with the answer (idempotent): its connection goes back to the pool when the
        body was read to its end, else it is closed (and a `chunk` still awaited raises)."""
        if self._ended:
            return
        self._ended = True
        complete = self.at_eof()
        if not complete and self._error is None:
            self._error = EngineBrokeOff("the answer was given up before its end")
            self._wake()
        pending, self._pending = self._pending, None
        if isinstance(pending, _Rest):
            pending.close()  # a delivery begun and never finished: nobody awaits it
        elif pending is not None:
            pending.cancel()
        self._conn.finished(complete)

    # From the connection, as the engine's bytes are parsed.
    def _body(self, data: bytes) -> None:
        self._parts.append(data)
        self._held += len(data)
        if self._held > HIGH_WATER:
            self._conn.hold()

    def _arrived(self) -> None:
        """After the engine's bytes were parsed: the new pieces delivered at once when pour
        waits for them, else the waiting `chunk` or `pour` woken."""
        if self._eager and self._parts and self._error is None and self._pending is None:
            self._push()
        self._wake()

    def _push(self) -> None:
        """Deliver what has come, stepping the delivery once here (see pour)."""
        assert self._deliver is not None
        parts, self._parts, self._held = self._parts, [], 0
        delivery = self._deliver(parts[0] if len(parts) == 1 else b"".join(parts))
        if not asyncio.iscoroutine(delivery):  # an awaitable that is no coroutine: awaited as one
            self._pending = asyncio.ensure_future(delivery)
        else:
            try:
                awaited = delivery.send(None)
            except StopIteration:
                return  # delivered
            except BaseException as exc:  # the delivery failed: pour says so
                self._error = exc
                return
            self._pending = _Rest(delivery, awaited)
        self._conn.hold()  # the client's socket is full: so is ours, for the engine

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is None or waiter.done():
            return
        if (
            self._done
            or self._error
            or self._pending is not None
            or (self._parts and not self._eager)
        ):
            waiter.set_result(None)


class _Connection(asyncio.Protocol):
    """One keep-alive connection to an engine, one request at a time."""

    def __init__(self, pool: Pool, port: int) -> None:
        self.pool, self.port = pool, port
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.answer: Answer | None = None
        self.head: asyncio.Future[Answer] | None = None
        self.keep = True
        self.closed = False
        self.idle_since = 0.0
        self.held = False

    # asyncio.Protocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass

    def data_received(self, data: bytes) -> None:
        answer = self.answer
        if answer is None:  # bytes nobody asked for: the connection is not to be trusted
            self.close()
            return
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self._fail(EngineBrokeOff(f"the engine's answer does not parse: {exc}"))
            self.close()
            return
        answer._arrived()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.pool.forget(self)
        answer = self.answer
        if answer is not None and not answer._done:
            self._fail(EngineBrokeOff("the engine closed the connection before its answer ended"))

    # httptools callbacks
    def on_header(self, name: bytes, value: bytes) -> None:
        assert self.answer is not None
        self.answer.headers.append((name.lower(), value))

    def on_headers_complete(self) -> None:
        answer = self.answer
        assert answer is not None
        answer.status = self.parser.get_status_code()
        self.keep = self.parser.should_keep_alive()
        if self.head is not None and not self.head.done():
            self.head.set_result(answer)

    def on_body(self, data: bytes) -> None:
        assert self.answer is not None
        self.answer._body(data)

    def on_message_complete(self) -> None:
        assert self.answer is not None
        self.answer._done = True

    # the pool's and the answer's
    async def send(
        self, target: bytes, body: bytes | bytearray, headers: Iterable[tuple[bytes, bytes]]
    ) -> Answer:
        assert self.transport is not None
        self.answer = Answer(self)
        self.head = asyncio.get_running_loop().create_future()
        lines = [
            b"POST %s HTTP/1.1\r\nhost: 127.0.0.1:%d\r\ncontent-length: %d\r\n"
            % (target, self.port, len(body))
        ]
        lines.extend(b"%s: %s\r\n" % pair for pair in headers)
        lines.append(b"\r\n")
        if len(body) <= ONE_WRITE:
            self.transport.write(b"".join(lines) + body)  # one segment for the usual request
        else:  # a large body is not copied once more to join it to its head
            self.transport.write(b"".join(lines))
            self.transport.write(body)
        try:
            return await self.head
        except BaseException:
            self.close()
            raise

    def finished(self, complete: bool) -> None:
        self.answer = None
        if complete and self.keep and not self.closed:
            self.parser = httptools.HttpResponseParser(self)
            self.idle_since = time.monotonic()
            self.pool.keep(self)
        else:
            self.close()

    def hold(self) -> None:
        if not self.held and self.transport is not None:
            self.held = True
            self.transport.pause_reading()

    def resume(self) -> None:
        if self.held and self.transport is not None:
            self.held = False
            self.transport.resume_reading()

    def close(self) -> None:
        self.closed = True
        self.pool.forget(self)
        if self.transport is not None:
            self.transport.close()

    def _fail(self, error: BaseException) -> None:
        if self.head is not None and not self.head.done():
            self.head.set_exception(error)
        answer = self.answer
        if answer is not None and answer._error is None:
            answer._error = error
            answer._wake()


class Pool:
    """The connections to the engines on this host, by port, reused while fresh."""

    def __init__(self) -> None:
        self._idle: dict[int, list[_Connection]] = {}

    async def post(
        self,
        port: int,
        target: bytes,
        body: bytes | bytearray,
        headers: Iterable[tuple[bytes, bytes]],
    ) -> Answer:
        """Send POST `target` (path and query, as the client sent them) with `body` and
        `headers` to the engine on 127.0.0.1:`port`: its answer once its head has come
        (OSError or EngineBrokeOff when it does not answer)."""
        kept = self._take(port)
        if kept is not None:
            return await kept.send(target, body, headers)
        loop = asyncio.get_running_loop()
        _, conn = await asyncio.wait_for(
            loop.create_connection(lambda: _Connection(self, port), "127.0.0.1", port),
            CONNECT_TIMEOUT,
        )
        return await conn.send(target, body, headers)

    def _take(self, port: int) -> _Connection | None:
        idle = self._idle.get(port)
        now = time.monotonic()
        while idle:
            conn = idle.pop()
            if not conn.closed and now - conn.idle_since < IDLE:
                return conn
            conn.close()
        return None

    def keep(self, conn: _Connection) -> None:
        self._idle.setdefault(conn.port, []).append(conn)

    def forget(self, conn: _Connection) -> None:
        idle = self._idle.get(conn.port)
        if idle and conn in idle:
            idle.remove(conn)

    def close(self) -> None:
        """Close every idle connection (those in use close as their answers end)."""
        for idle in list(self._idle.values()):
            for conn in list(idle):
                conn.close()
        self._idle.clear()
