"""The control API (FastAPI), served by `laned serve` on daemon.listen.

Routes: `lanes` (the lanes' endpoints), `daemon` (health, fit, reload, metrics, service
discovery, events), both over the front (`laned.api.front`), and `openai` (the OpenAI endpoint,
`laned.api.proxy`); `guard` decides who may call, by the route a request resolves to and the
access the route declares; `settings` reads the API's settings from the config;
`door` takes every request first (the guard, then the proxy and the busiest reads);
`errors` holds the one error envelope and the table from laned's errors to HTTP statuses.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

from fastapi import FastAPI
from starlette.types import Receive, Scope, Send

from laned import __version__
from laned.api import daemon, errors, lanes, openai
from laned.api.door import Door
from laned.api.front import Front
from laned.api.guard import ApiSettings, Routes
from laned.api.metrics import LanedMetrics
from laned.api.proxy import Proxy

__all__ = ["ApiSettings", "create_app"]


class LanedApp(FastAPI):
    """The FastAPI application behind laned's door (laned.api.door): the server calls the
    door, which calls the application for what it does not answer itself."""

    door: Door | None = None
    reload_config: daemon.Reload | None = None  # POST /reload's, for SIGHUP too

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self.door is None:
            await super().__call__(scope, receive, send)
        else:
            await self.door(scope, receive, send)

    def configure(self, settings: ApiSettings) -> None:
        """Guard every request from now on by these settings (a reload's)."""
        assert self.door is not None
        self.door.configure(settings)

    async def behind(self, scope: Scope, receive: Receive, send: Send) -> None:
        """The application itself, without the door."""
        await super().__call__(scope, receive, send)


def create_app(
    front: Front, settings: ApiSettings, metrics: LanedMetrics | None = None
) -> LanedApp:
    """The FastAPI application over one running laned (its front: the supervisor and, for
    lanes over several hosts, the coordinator of their ranks)."""
    if metrics is None:
        metrics = LanedMetrics()
        metrics.attach(front)
    proxy = Proxy(front, metrics)

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        yield
        await proxy.close()

    app = LanedApp(
        title="laned",
        version=__version__,
        description="Control API of laned, the inference lane daemon, and its OpenAI endpoint.",
        lifespan=lifespan,
    )
    errors.install(app)
    # The routes go on the application's own router, one flat list, no included routers:
    # the door resolves each request over the same list, the same way, before anything runs,
    # and every route declares its access (Routes refuses one that does not).
    lanes.routes(app.router, front)
    app.reload_config = daemon.Reload(front, metrics, app.configure)
    daemon.routes(app.router, front, metrics, app.reload_config)
    openai.routes(app.router, proxy)
    app.door = Door(app.behind, Routes(app.routes), settings, front, proxy, metrics)
    return app
