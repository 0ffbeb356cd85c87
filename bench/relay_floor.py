#!/usr/bin/env python3
"""The floor of a relay in Python: bytes from each client connection to the engine and back,
as they come, nothing parsed, nothing added (asyncio protocols, one process):

    .venv/bin/python bench/relay_floor.py LISTEN_PORT ENGINE_PORT

No HTTP proxy written in Python can spend less CPU on a request or a chunk than this on the
same machine and the same event loop: bench/proxy_cost.py measures laned beside it. It is not
a proxy anyone should run (no routing, no errors, no draining).
"""

from __future__ import annotations

import asyncio
import sys


class _Pipe(asyncio.Protocol):
    """One side of a relayed connection: what it receives goes to `other`'s transport."""

    def __init__(self) -> None:
        self.other: asyncio.Transport | None = None
        self.early: list[bytes] = []
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        if self.other is None:
            self.early.append(data)  # before the engine's side is connected
        else:
            self.other.write(data)

    def connection_lost(self, exc: Exception | None) -> None:
        if self.other is not None:
            self.other.close()

    def join(self, other: asyncio.Transport) -> None:
        self.other = other
        for data in self.early:
            other.write(data)
        self.early.clear()


async def serve(listen: int, engine: int) -> None:
    loop = asyncio.get_running_loop()
    connecting: set[asyncio.Task[None]] = set()  # kept until done (the loop holds tasks weakly)

    def accepted() -> _Pipe:
        client = _Pipe()

        async def connect() -> None:
            transport, upstream = await loop.create_connection(_Pipe, "127.0.0.1", engine)
            assert client.transport is not None
            upstream.join(client.transport)
            client.join(transport)

        task = loop.create_task(connect())
        connecting.add(task)
        task.add_done_callback(connecting.discard)
        return client

    server = await loop.create_server(accepted, "127.0.0.1", listen)
    await server.serve_forever()


if __name__ == "__main__":
    asyncio.run(serve(int(sys.argv[1]), int(sys.argv[2])))
