"""laned's door: every HTTP request meets the guard here, and the busiest ones go straight on.

FastAPI's own path for a request is middleware after middleware (its error handler, its
telemetry, its body limit, then the router matching the path against each of laned's routes,
then dependency injection and the response's encoding): tens of microseconds that a bare app
of two routes pays less of, and that a streamed answer paid again per chunk in the wrappers
of `send`. The door takes, before all that (docs/decisions/0008-own-upstream-client.md):

- `POST /v1/...`: to the proxy as ASGI (laned.api.proxy);
- `GET /lanes` and `GET /metrics`, which dashboards and Prometheus poll: answered from the
  same functions and response classes as their routes, with the same bytes and headers.

Everything else goes on to the FastAPI application, whose routes for these stay for the
OpenAPI schema (and answer the same way). The guard's checks come first for every request,
on the route the request resolves to (laned.api.guard); the busy reads and the proxy are
picked by that route too, never by the path's spelling.
"""

from __future__ import annotations

import contextlib
from urllib.parse import urlsplit

from starlette.responses import JSONResponse, Response
from starlette.types import ASGIApp, Receive, Scope, Send

from laned.api.errors import unexpected
from laned.api.front import Front
from laned.api.guard import ApiSettings, Call, Guard, Routes
from laned.api.metrics import METRICS_MEDIA, LanedMetrics
from laned.api.proxy import Proxy


def hostname(scope: Scope) -> str:
    """The host the client called (as Starlette's `request.url.hostname`), for the URLs a
    view gives back."""
    for name, value in scope["headers"]:
        if name == b"host":
            return urlsplit("//" + value.decode("latin-1")).hostname or "127.0.0.1"
    server = scope.get("server")
    return str(server[0]) if server else "127.0.0.1"


class Door:
    """The ASGI application uvicorn serves: the guard, then the proxy, the two busy reads,
    or the FastAPI application (`app`)."""

    def __init__(
        self,
        app: ASGIApp,
        routes: Routes,
        settings: ApiSettings,
        front: Front,
        proxy: Proxy,
        metrics: LanedMetrics,
    ) -> None:
        self.app, self.routes, self.proxy = app, routes, proxy
        self.guard = Guard(settings, routes)
        self.front, self.metrics = front, metrics
        # Answered here, by the route the request resolves to.
        self.fast: dict[tuple[str, str], ASGIApp] = {
            ("GET", "/lanes"): self._lanes,
            ("GET", "/metrics"): self._metrics,
            ("POST", "/v1/{path:path}"): self.proxy.asgi,
        }

    def configure(self, settings: ApiSettings) -> None:
        """Judge every request from now on by these settings (a reload's)."""
        self.guard = Guard(settings, self.routes)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        refused = self.guard.refusal(scope)
        if refused is not None:
            await refused(scope, receive, send)
            return
        route = Call.of(scope).route
        handler = self.fast.get((scope["method"], getattr(route, "path", "")))
        if handler is None:
            await self.app(scope, receive, send)  # answers its own errors
            return
        try:
            await handler(scope, receive, send)
        except Exception as exc:
            # As FastAPI's error middleware would: laned's envelope when nothing was sent yet
            # (the server refuses a second start: an answer under way is cut instead), and
            # the exception on to the server, which logs it.
            with contextlib.suppress(RuntimeError):
                await unexpected(exc)(scope, receive, send)
            raise

    async def _lanes(self, scope: Scope, receive: Receive, send: Send) -> None:
        views = await self.front.views(hostname(scope))
        await JSONResponse(views)(scope, receive, send)

    async def _metrics(self, scope: Scope, receive: Receive, send: Send) -> None:
        await Response(await self.metrics.scrape(), media_type=METRICS_MEDIA)(scope, receive, send)
