"""The engines as a running laned reaches them: one connection pool, shared by every client
of an engine (laned.adapters.engine_api.EngineClient: the watchers' probes, the canary, the
sleep routes, the acceptance checks), and the TCP check of a port about to open.
"""

from __future__ import annotations

import asyncio
import socket

import httpx

from laned import engines
from laned.adapters.engine_api import (
    ENGINE_KEEP_ALIVE,
    ENGINE_POOL,
    EngineClient,
    parse_engine_metrics,
)
from laned.engines.profile import EngineProfile

# An engine's /metrics as laned reads them: its home is laned.adapters.engine_api.
__all__ = [
    "ENGINE_KEEP_ALIVE",
    "ENGINE_POOL",
    "Probe",
    "parse_engine_metrics",
]


class Probe:
    """laned's engines on this host, over one pool of connections."""

    def __init__(self, timeout: float = 5.0, host: str = "127.0.0.1") -> None:
        self.client = httpx.AsyncClient(timeout=timeout, limits=ENGINE_POOL)
        self.timeout, self.host = timeout, host

    async def close(self) -> None:
        """Close the connection pool."""
        await self.client.aclose()

    def url(self, port: int, path: str) -> str:
        """The engine URL for a path."""
        return f"http://{self.host}:{port}{path}"

    def engine(
        self,
        port: int,
        model: str = "",
        api_key: str | None = None,
        timeout: float = 0,
        profile: EngineProfile = engines.DEFAULT,
    ) -> EngineClient:
        """The engine on `port` (serving `model`, with the lane's key), over the shared pool;
        `timeout`: of each request (default: the probes'); `profile`: which engine it is."""
        return EngineClient(
            self.url(port, ""),
            model,
            api_key,
            timeout or self.timeout,
            pool=self.client,
            profile=profile,
        )

    async def accepts(self, port: int) -> bool:
        """Whether the port takes a TCP connection: a refused connect costs about 45 µs of
        CPU (an HTTP probe a millisecond), so a close watch on a port about to open asks
        this first."""
        family = socket.AF_INET6 if ":" in self.host else socket.AF_INET
        with socket.socket(family, socket.SOCK_STREAM) as sock:
            sock.setblocking(False)
            try:
                await asyncio.get_running_loop().sock_connect(sock, (self.host, port))
            except OSError:
                return False
        return True
