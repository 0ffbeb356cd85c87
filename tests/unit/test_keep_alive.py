"""Keep-alive ordering: whoever pools a connection gives it up before the other side closes it.

When a server closes an idle connection just as a pooled client sends on it, the client gets
a reset instead of an answer (uvicorn and httpx both default to 5 s, which makes it likely):
for laned a false probe failure or a failed gate against an engine, a failed call against
its own API.
"""

from __future__ import annotations

import httpx
from fastapi import FastAPI

from laned import daemon
from laned.adapters.probes import ENGINE_KEEP_ALIVE, ENGINE_POOL
from laned.api import ApiSettings
from laned.sim import http as sim_http


def test_laned_gives_up_pooled_engine_connections_before_the_engine_closes_them() -> None:
    assert ENGINE_POOL.keepalive_expiry is not None
    assert ENGINE_POOL.keepalive_expiry < ENGINE_KEEP_ALIVE
    assert sim_http.KEEP_ALIVE == ENGINE_KEEP_ALIVE  # the simulator closes them as vLLM does


def test_the_control_api_keeps_idle_connections_longer_than_clients_pool_them() -> None:
    server = daemon.api_server(FastAPI(), ApiSettings("127.0.0.1", 9000, None, False))
    client_expiry = httpx.Limits().keepalive_expiry or 0  # httpx's default pool: 5 s
    assert server.config.timeout_keep_alive == daemon.API_KEEP_ALIVE
    assert client_expiry < daemon.API_KEEP_ALIVE
