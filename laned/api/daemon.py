"""laned's own endpoints: the status page, health, the host's fit, reload, metrics, service
discovery, events."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from importlib import resources
from typing import Any

from fastapi import APIRouter, Query, Request
from fastapi.responses import HTMLResponse, Response, StreamingResponse

from laned import __version__
from laned.api.front import Front
from laned.api.guard import Access, ApiSettings, access
from laned.api.metrics import METRICS_MEDIA, LanedMetrics
from laned.api.settings import api_settings
from laned.core.lanes import Event
from laned.errors import ConfigError, ConfigRefused, SecretFileRefused, UnsafeApi

# One file shipped in the package: no build step, nothing fetched from elsewhere.
PAGE = resources.files("laned.api").joinpath("static/status.html").read_text(encoding="utf-8")
PAGE_HEADERS = {
    # Its own inline script and style only; never framed (its buttons change lanes).
    "Content-Security-Policy": "default-src 'self'; script-src 'unsafe-inline'; "
    "style-src 'unsafe-inline'; frame-ancestors 'none'",
    "X-Frame-Options": "DENY",
    "Cache-Control": "no-cache",
}


def _sse(event: Event) -> bytes:
    return b"data: " + json.dumps(event.to_json()).encode() + b"\n\n"


class Reload:
    """The one way laned reloads its config: POST /reload and SIGHUP (`laned serve`, which
    `systemctl --user reload laned` sends) both call it. One reload at a time: a second
    waits for the first, then reads the file as it is then."""

    def __init__(
        self, front: Front, metrics: LanedMetrics, configure: Callable[[ApiSettings], None]
    ) -> None:
        self.front, self.metrics, self.configure = front, metrics, configure
        self._one = asyncio.Lock()

    async def __call__(self) -> dict[str, Any]:
        """Re-read the config, check it as `laned serve` does, re-render, daemon-reload; each
        changed key applied as its field declares. ConfigError (a bad config) or
        ConfigRefused (one only a restart of laned applies): nothing changed."""
        async with self._one:
            try:
                new = await self.front.load()
                try:
                    settings = api_settings(new)
                except (UnsafeApi, SecretFileRefused) as exc:  # as `laned serve` refuses to start
                    raise ConfigRefused(exc.message, exc.hint) from None
                result = await self.front.reload(new, settings.peer_token)
            except ConfigError:
                self.metrics.reload("invalid")
                raise
            except ConfigRefused:
                self.metrics.reload("refused")
                raise
            self.configure(settings)  # the guard's token, reads, peers, from the next request on
            self.metrics.reload("applied")
            return result


def routes(api: APIRouter, front: Front, metrics: LanedMetrics, reload_config: Reload) -> None:
    """The daemon's endpoints over one front, added to `api` (the application's own router;
    `reload_config`: what POST /reload does, SIGHUP's too)."""

    @api.get("/", include_in_schema=False)
    @access(Access.PUBLIC)
    async def status_page() -> HTMLResponse:
        """The status page: every lane live, activate/deactivate buttons (docs/api.md)."""
        return HTMLResponse(PAGE, headers=PAGE_HEADERS)

    @api.get("/healthz")
    @access(Access.PUBLIC)
    async def healthz() -> dict[str, Any]:
        """laned itself is up; `notices`: what it met and recovered from (an unreadable
        state.json, say)."""
        return {"status": "ok", "version": __version__, "notices": front.notices()}

    @api.get("/fit")
    @access(Access.READ)
    async def host_fit() -> dict[str, Any]:
        """Which configured lanes this host can run at all (their `needs` against its GPUs,
        memory and disks)."""
        return await front.fit()

    @api.get("/gpus")
    @access(Access.READ)
    async def gpus() -> dict[str, Any]:
        """Each GPU's memory (NVML) and which lane's engine holds it, per process."""
        return await front.gpus()

    @api.get("/weights")
    @access(Access.READ)
    async def weights() -> dict[str, Any]:
        """Each lane's weight files and how much of them is in the page cache now (mincore)."""
        return await front.weights()

    @api.get("/timeline")
    @access(Access.READ)
    async def timeline(
        hours: float = Query(24, gt=0, le=24, description="how far back, at most a day"),
    ) -> dict[str, Any]:
        """Every lane transition of the last `hours` (kept across laned's restarts): which
        lane held each group, its failures among them."""
        return front.timeline(hours)

    @api.post("/reload")
    @access(Access.MUTATE)
    async def reload() -> dict[str, Any]:
        """Re-read the config, check it as `laned serve` does, re-render, daemon-reload; each
        changed key applied as its field declares (`keys`: live, next start, restart),
        `restart_needed` the running lanes that wait for their next start. A bad config (400)
        or one only a restart of laned applies (409) changes nothing. SIGHUP does the same."""
        return await reload_config()

    @api.get("/metrics")
    @access(Access.READ)
    async def prometheus_metrics() -> Response:
        """laned's own metrics (Prometheus text format)."""
        return Response(await metrics.scrape(), media_type=METRICS_MEDIA)

    @api.get("/sd")
    @access(Access.READ)
    async def service_discovery(request: Request) -> list[dict[str, Any]]:
        """Prometheus HTTP service discovery: the running lanes' engine /metrics endpoints."""
        return front.sd_targets(request.url.hostname or "127.0.0.1")

    @api.get("/events", response_model=None)
    @access(Access.READ)
    async def events(
        request: Request,
        limit: int = Query(100, ge=1, le=500),
        lane: str | None = None,
        follow: bool = Query(False, description="stream new transitions as Server-Sent Events"),
    ) -> dict[str, Any] | StreamingResponse:
        """Recent transitions, oldest first; with follow=true, then every new one as it happens."""
        chosen = front.events(lane, limit)
        if not follow:
            return {"events": [e.to_json() for e in chosen]}

        async def stream() -> AsyncIterator[bytes]:
            with front.subscribe(lane) as queue:
                for event in chosen:
                    yield _sse(event)
                yield b": following\n\n"  # subscribed: every event from here on is sent
                while not await request.is_disconnected():
                    try:
                        event = await asyncio.wait_for(queue.get(), 15)
                    except asyncio.TimeoutError:
                        yield b": keep-alive\n\n"
                        continue
                    yield _sse(event)

        return StreamingResponse(
            stream(), media_type="text/event-stream", headers={"Cache-Control": "no-cache"}
        )
