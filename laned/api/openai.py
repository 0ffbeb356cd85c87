"""laned's OpenAI endpoint (laned.api.proxy): GET /v1/models and every POST /v1/....

A POST under /v1 goes from the server straight to the proxy (laned.api.door, after the
guard): no router, no dependency injection, no StreamingResponse, so that what laned spends
on a request and on each chunk of a streamed answer stays near the floor
(bench/proxy_cost.py, docs/performance.md). The router's route stays for the OpenAPI schema
and answers the same way.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from starlette.responses import Response
from starlette.types import ASGIApp, Receive, Scope, Send

from laned.api.guard import Access, Call, access
from laned.api.proxy import Proxy


class Raw(Response):
    """A response that is an ASGI app of its own: the proxy's."""

    def __init__(self, app: ASGIApp) -> None:  # no body, headers or status of its own
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self.app(scope, receive, send)


def routes(api: APIRouter, proxy: Proxy) -> None:
    """The /v1 endpoints over one proxy, added to `api` (the application's own router)."""

    @api.get("/v1/models")
    @access(Access.PUBLIC)  # OpenAI's clients list models with the engine's key, not laned's
    async def models(request: Request) -> dict[str, Any]:
        """Every configured model, with its lane's state (an extra `laned` field) for a
        caller who may read laned's state: with daemon.token_for_reads, only with laned's
        token; without it, the models' names alone."""
        return proxy.models(Call.of(request.scope).reads)

    @api.post("/v1/{path:path}", response_model=None)
    @access(Access.PUBLIC)  # the engine judges the lane's API key
    async def forward(path: str) -> Response:
        """Routed by the body's `model` to its lane; the engine's answer passes through."""
        return Raw(proxy.asgi)
