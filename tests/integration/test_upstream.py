"""laned's connections to the engines (laned.adapters.upstream) against a real HTTP server on
loopback: answers chunked and with a length, kept connections, an engine that breaks off, a
client that gives up, a body nobody reads, a connection gone stale, and bytes that are not
HTTP."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from laned.adapters import upstream
from laned.adapters.upstream import EngineBrokeOff, Pool

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]
SSE = b"data: {}\n\n"
HEAD = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"


async def request_of(reader: asyncio.StreamReader) -> bytes:
    """One request, head and body (read by its content-length); b"" when the client closed."""
    head = await reader.readuntil(b"\r\n\r\n") if not reader.at_eof() else b""
    lengths = [line for line in head.split(b"\r\n") if line.lower().startswith(b"content-length")]
    return head + await reader.readexactly(int(lengths[0].split(b":")[1])) if head else b""


class Engine:
    """A loopback server answering with `handler`, counting its connections."""

    def __init__(self, handler: Handler) -> None:
        self.handler, self.connections, self.requests = handler, 0, []  # type: ignore[var-annotated]
        self.closed = asyncio.Event()

    async def __aenter__(self) -> int:
        async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            self.connections += 1
            try:
                await self.handler(reader, writer)
            except (asyncio.IncompleteReadError, ConnectionError):
                pass
            finally:
                writer.close()
                self.closed.set()

        self.server = await asyncio.start_server(serve, "127.0.0.1", 0)
        return int(self.server.sockets[0].getsockname()[1])

    async def __aexit__(self, *exc: Any) -> None:
        self.server.close()


def run(scenario: Callable[[], Awaitable[None]]) -> None:
    asyncio.run(asyncio.wait_for(scenario(), 30))


def test_a_chunked_answer_comes_as_it_is_sent_and_its_connection_is_kept() -> None:
    async def scenario() -> None:
        go = asyncio.Event()

        async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            while request := await request_of(reader):
                assert request.startswith(b"POST /v1/completions?x=1 HTTP/1.1\r\n"), request
                assert b"\r\nauthorization: Bearer k\r\n" in request and request.endswith(b"{}")
                writer.write(HEAD + b"%x\r\n%s\r\n" % (len(SSE), SSE))
                await go.wait()  # the first event is taken before the second is sent
                go.clear()
                writer.write(b"%x\r\n%s\r\n0\r\n\r\n" % (len(SSE), SSE))

        engine = Engine(handler)
        async with engine as port:
            pool = Pool()
            for _ in range(2):
                answer = await pool.post(port, b"/v1/completions?x=1", b"{}", [(b"authorization", b"Bearer k")])  # fmt: skip
                assert answer.status == 200
                assert (b"content-type", b"text/event-stream") in answer.headers
                assert await answer.chunk() == SSE
                go.set()
                assert await answer.chunk() == SSE
                assert await answer.chunk() == b"" and answer.at_eof()
                answer.end()
            assert engine.connections == 1, "the connection was not kept for the next request"
            pool.close()

    run(scenario)


def test_an_answer_with_a_length_and_connection_close_is_not_kept() -> None:
    async def scenario() -> None:
        async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await request_of(reader)
            writer.write(b"HTTP/1.1 404 Not Found\r\nContent-Length: 5\r\nConnection: close\r\n\r\nnope!")  # fmt: skip

        engine = Engine(handler)
        async with engine as port:
            pool = Pool()
            for _ in range(2):
                answer = await pool.post(port, b"/v1/x", b"", [])
                assert answer.status == 404 and (b"content-length", b"5") in answer.headers
                assert await answer.read() == b"nope!"
                answer.end()
            assert engine.connections == 2

    run(scenario)


def test_an_engine_that_breaks_off_mid_answer_is_an_error_not_an_end() -> None:
    async def scenario() -> None:
        async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await request_of(reader)
            writer.write(HEAD + b"%x\r\n%s\r\n" % (len(SSE), SSE))  # then closes: no last chunk

        async with Engine(handler) as port:
            answer = await Pool().post(port, b"/v1/x", b"", [])
            assert await answer.chunk() == SSE
            with pytest.raises(EngineBrokeOff):
                await answer.chunk()
            assert not answer.at_eof()
            answer.end()

    run(scenario)


def test_an_answer_given_up_closes_its_connection_and_wakes_its_reader() -> None:
    async def scenario() -> None:
        async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await request_of(reader)
            writer.write(HEAD)
            await reader.read()  # until laned closes the connection: vLLM aborts the request

        engine = Engine(handler)
        async with engine as port:
            answer = await Pool().post(port, b"/v1/x", b"", [])
            reading = asyncio.ensure_future(answer.chunk())
            answer.end()  # the client went away
            with pytest.raises(EngineBrokeOff):
                await reading
            await asyncio.wait_for(engine.closed.wait(), 5)

    run(scenario)


def test_a_body_nobody_reads_stops_the_reading_until_it_is_taken() -> None:
    async def scenario() -> None:
        block = b"x" * 65536
        count = 2 * upstream.HIGH_WATER // len(block) + 4

        async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await request_of(reader)
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n" % (count * len(block)))
            for _ in range(count):
                writer.write(block)
                await writer.drain()

        async with Engine(handler) as port:
            answer = await Pool().post(port, b"/v1/x", b"", [])
            conn = answer._conn
            deadline = asyncio.get_running_loop().time() + 10
            while not conn.held:  # laned reads up to its high-water mark, then stops
                assert asyncio.get_running_loop().time() < deadline, "never stopped reading"
                await asyncio.sleep(0.01)
            assert upstream.HIGH_WATER < answer._held < upstream.HIGH_WATER + 2 * len(block) + 65536  # fmt: skip
            assert len(await answer.read()) == count * len(block)
            assert not conn.held

    run(scenario)


def test_a_stale_connection_is_not_reused_and_a_closed_port_is_an_os_error() -> None:
    async def scenario() -> None:
        async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            while await request_of(reader):
                writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")

        engine = Engine(handler)
        async with engine as port:
            pool = Pool()
            answer = await pool.post(port, b"/v1/x", b"", [])
            assert await answer.read() == b"ok"
            answer.end()
            (kept,) = pool._idle[port]
            kept.idle_since -= upstream.IDLE  # as if it had waited that long
            answer = await pool.post(port, b"/v1/x", b"", [])
            assert await answer.read() == b"ok"
            answer.end()
            assert engine.connections == 2 and kept.closed
            pool.close()
        with pytest.raises(OSError):
            await Pool().post(port, b"/v1/x", b"", [])  # nothing listens there now

    run(scenario)


def test_bytes_that_are_not_http_are_an_error() -> None:
    async def scenario() -> None:
        async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await request_of(reader)
            writer.write(b"SSH-2.0-OpenSSH_9.6\r\n\r\n")
            await reader.read()

        async with Engine(handler) as port:
            with pytest.raises(EngineBrokeOff, match="does not parse"):
                await Pool().post(port, b"/v1/x", b"", [])

    run(scenario)


def streamed(events: int) -> Handler:
    """An engine that streams `events` SSE events, one chunk each, then ends the answer."""

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while await request_of(reader):
            writer.write(HEAD)
            for i in range(events):
                event = b"data: %d\n\n" % i
                writer.write(b"%x\r\n%s\r\n" % (len(event), event))
                await writer.drain()
                await asyncio.sleep(0.002)  # each its own arrival, as tokens come
            writer.write(b"0\r\n\r\n")

    return handler


def test_pour_delivers_each_piece_as_it_arrives_without_waking_the_relay() -> None:
    async def scenario() -> None:
        engine = Engine(streamed(40))
        async with engine as port:
            pool = Pool()
            got, tasks = [], []

            async def deliver(body: bytes) -> None:
                got.append(body)
                tasks.append(asyncio.current_task())  # None: a callback's, not a task's

            answer = await pool.post(port, b"/v1/x", b"", [])
            await answer.pour(deliver)
            assert b"".join(got) == b"".join(b"data: %d\n\n" % i for i in range(40))
            # Delivered from the connection's data_received, but what came before pour began.
            assert tasks.count(None) >= len(tasks) - 1 and len(tasks) >= 20, tasks
            answer.end()
            assert engine.connections == 1 and pool._idle[port], "the connection was not kept"
            pool.close()

    run(scenario)


def test_a_delivery_that_waits_holds_the_engine_and_the_rest_follows_in_order() -> None:
    async def scenario() -> None:
        async with Engine(streamed(30)) as port:
            answer = await Pool().post(port, b"/v1/x", b"", [])
            free, got = asyncio.Event(), []

            async def deliver(body: bytes) -> None:
                if not got:
                    await free.wait()  # the client's socket is full, for a while
                got.append(body)

            pouring = asyncio.ensure_future(answer.pour(deliver))
            deadline = asyncio.get_running_loop().time() + 10
            while not answer._conn.held:  # the engine's socket is not read meanwhile
                assert asyncio.get_running_loop().time() < deadline, "never held the engine"
                await asyncio.sleep(0.01)
            await asyncio.sleep(0.1)  # a window in which nothing may arrive: not a wait
            assert not got and not pouring.done()
            free.set()
            await pouring
            assert b"".join(got) == b"".join(b"data: %d\n\n" % i for i in range(30))
            assert not answer._conn.held and answer.at_eof()
            answer.end()

    run(scenario)


def test_pour_ends_with_the_error_of_a_delivery_or_of_an_answer_given_up() -> None:
    async def scenario() -> None:
        async with Engine(streamed(30)) as port:
            pool = Pool()
            answer = await pool.post(port, b"/v1/x", b"", [])

            async def broken(body: bytes) -> None:
                raise RuntimeError("the client's send failed")

            with pytest.raises(RuntimeError, match="send failed"):
                await answer.pour(broken)
            answer.end()

            answer = await pool.post(port, b"/v1/x", b"", [])
            never, entered = asyncio.Event(), asyncio.Event()

            async def stuck(body: bytes) -> None:
                entered.set()
                await never.wait()

            pouring = asyncio.ensure_future(answer.pour(stuck))
            await asyncio.wait_for(entered.wait(), 10)  # its delivery waits now
            answer.end()  # the client went away while its delivery waited:
            never.set()  # uvicorn's send then returns (connection_lost resumes writing)
            with pytest.raises(EngineBrokeOff):
                await pouring

    run(scenario)
