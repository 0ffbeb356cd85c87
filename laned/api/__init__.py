"""The control API (FastAPI), served by `laned serve` on daemon.listen.

Routers: `lanes` (the lanes' endpoints), `daemon` (health, fit, reload, metrics, service
discovery, events), both over the front (`laned.api.front`), and `openai` (the OpenAI endpoint,
`laned.api.proxy`); `guard` decides who may call;
`errors` holds the one error envelope and the table from laned's errors to HTTP statuses.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

from fastapi import FastAPI

from laned import __version__
from laned.api import daemon, errors, lanes, openai
from laned.api.front import Front
from laned.api.guard import ApiSettings, Guard
from laned.api.metrics import LanedMetrics
from laned.api.proxy import Proxy

__all__ = ["ApiSettings", "create_app"]


def create_app(front: Front, settings: ApiSettings, metrics: LanedMetrics | None = None) -> FastAPI:
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

    app = FastAPI(
        title="laned",
        version=__version__,
        description="Control API of laned, the inference lane daemon, and its OpenAI endpoint.",
        lifespan=lifespan,
    )
    errors.install(app)
    app.add_middleware(openai.FastV1, proxy=proxy)  # inside the guard: it checks first
    app.add_middleware(Guard, settings=settings)
    app.include_router(lanes.router(front))
    app.include_router(daemon.router(front, metrics))
    app.include_router(openai.router(proxy))
    return app
