"""laned's OpenAI endpoint (laned.api.proxy): GET /v1/models and every POST /v1/...."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response

from laned.api.proxy import Proxy


def router(proxy: Proxy) -> APIRouter:
    """The /v1 endpoints over one proxy."""
    api = APIRouter()

    @api.get("/v1/models")
    async def models() -> dict[str, Any]:
        """Every configured model with its lane's state (an extra `laned` field)."""
        return proxy.models()

    @api.post("/v1/{path:path}", response_model=None)
    async def forward(path: str, request: Request) -> Response:
        """Routed by the body's `model` to its lane; the engine's answer passes through."""
        return await proxy.forward(request, path)

    return api
