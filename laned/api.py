"""The control API (FastAPI), served by `laned serve` on daemon.listen.

Every error is one envelope, `{"error": {"code", "message", "hint"}}`. Mutating endpoints
answer GET too (so `curl :9000/lanes/dsv41/activate` works as people type it), which is
why every request must name laned by a Host it expects (DNS rebinding) and why browser
cross-site requests to mutating endpoints are refused (Origin / Sec-Fetch-Site). With a
token, mutating endpoints need `Authorization: Bearer <token>`.
"""

from __future__ import annotations

import asyncio
import hmac
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Annotated, Any
from urllib.parse import urlsplit

from fastapi import FastAPI, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from laned import __version__, journal
from laned.acceptance import LaneNotRunning
from laned.config import GATES, load_config
from laned.errors import (
    ActivationFailed,
    ConfigError,
    ConfigRefused,
    LaneError,
    PodmanError,
    PreflightFailed,
    Superseded,
    UnknownLane,
)
from laned.host import meminfo
from laned.lanes import RUNNING_STATES, Desired, Event, LaneStatus
from laned.metrics import LanedMetrics
from laned.names import container_name, unit_name
from laned.preflight import HostFacts, blocking, findings_json, fit_report, refusal, report
from laned.supervisor import Supervisor

LOCAL_NAMES = {"localhost", "127.0.0.1", "::1", "[::1]"}


@dataclass(frozen=True)
class ApiSettings:
    """What the API needs besides the supervisor."""

    listen_host: str
    listen_port: int
    token: str | None = None
    token_for_reads: bool = False  # also /lanes, /metrics, /sd, /events ... (not /healthz)


def envelope(
    status: int, code: str, message: str, hint: str = "", extra: dict[str, Any] | None = None
) -> JSONResponse:
    """The one error shape (`extra` adds detail, such as preflight's findings)."""
    error = {"code": code, "message": message, "hint": hint, **(extra or {})}
    return JSONResponse({"error": error}, status_code=status)


class ApiError(Exception):
    """An error answered with the envelope."""

    def __init__(
        self,
        status: int,
        code: str,
        message: str,
        hint: str = "",
        extra: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(message)
        self.status, self.code, self.message, self.hint = status, code, message, hint
        self.extra = extra


def _host_of(value: str) -> str:
    value = value.strip().lower()
    if value.startswith("["):
        return value[: value.find("]") + 1] if "]" in value else value
    return value.rsplit(":", 1)[0] if value.count(":") == 1 else value


def create_app(
    supervisor: Supervisor, settings: ApiSettings, metrics: LanedMetrics | None = None
) -> FastAPI:
    """The FastAPI application over one supervisor."""
    if metrics is None:
        metrics = LanedMetrics()
        metrics.attach(supervisor)
    app = FastAPI(
        title="laned",
        version=__version__,
        description="Control API of laned, the inference lane daemon.",
    )
    allowed_hosts = LOCAL_NAMES | {
        settings.listen_host.lower(),
        f"[{settings.listen_host.lower()}]",
    }

    @app.exception_handler(ApiError)
    async def _api_error(_: Request, exc: ApiError) -> JSONResponse:
        return envelope(exc.status, exc.code, exc.message, exc.hint, exc.extra)

    @app.exception_handler(RequestValidationError)
    async def _bad_request(_: Request, exc: RequestValidationError) -> JSONResponse:
        first = exc.errors()[0] if exc.errors() else {}
        where = ".".join(str(p) for p in first.get("loc", ()) if p not in ("query", "path"))
        return envelope(
            400,
            "bad-request",
            f"{where}: {first.get('msg', 'invalid')}",
            "see /docs for the parameters",
        )

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        code = {404: "not-found", 405: "method-not-allowed"}.get(exc.status_code, "http-error")
        return envelope(exc.status_code, code, str(exc.detail), "see /docs for the endpoints")

    @app.exception_handler(Exception)
    async def _unexpected(_: Request, exc: Exception) -> JSONResponse:
        return envelope(
            500,
            "internal",
            f"laned failed: {type(exc).__name__}",
            "see laned's log (journalctl --user -u laned)",
        )

    @app.middleware("http")
    async def _guard(request: Request, call_next: Any) -> Response:
        host = _host_of(request.headers.get("host", ""))
        if host not in allowed_hosts:
            return envelope(
                403,
                "forbidden-host",
                f"Host {request.headers.get('host', '')!r} is not laned's",
                f"use http://127.0.0.1:{settings.listen_port} or the configured listen address",
            )
        mutating = request.method == "POST" or request.url.path.endswith(
            ("/activate", "/deactivate", "/restart")
        )
        if mutating:
            site = request.headers.get("sec-fetch-site")
            origin = request.headers.get("origin")
            origin_host = _host_of(urlsplit(origin).netloc) if origin else None
            if (site is not None and site not in ("same-origin", "none")) or (
                origin_host is not None and origin_host not in allowed_hosts
            ):
                return envelope(
                    403,
                    "cross-site",
                    "cross-site requests may not change lanes",
                    "use curl or the laned CLI",
                )
        if settings.token is not None and (
            mutating or (settings.token_for_reads and request.url.path != "/healthz")
        ):
            given = request.headers.get("authorization", "")
            if not given:
                return envelope(
                    401,
                    "unauthorized",
                    "this endpoint needs a bearer token",
                    "send Authorization: Bearer <token from daemon.token_file>",
                )
            if not hmac.compare_digest(given.encode(), f"Bearer {settings.token}".encode()):
                return envelope(
                    403,
                    "forbidden",
                    "the bearer token is wrong",
                    "use the token in daemon.token_file",
                )
        response: Response = await call_next(request)
        return response

    async def container_view(lane: str) -> dict[str, Any] | None:
        spec = supervisor.config.lanes[lane]
        if spec.container is None or supervisor.host is None:
            return None
        name = container_name(lane, spec)
        try:
            state = await supervisor.host.podman.container(name)
        except PodmanError as exc:
            # Only the view suffers: the lane itself runs under systemd, not through the API.
            return {"name": name, "status": "unknown", "error": exc.message, "hint": exc.hint}
        return {"name": name, "status": "absent"} if state is None else state.to_json()

    async def view(status: LaneStatus, request: Request) -> dict[str, Any]:
        spec = supervisor.config.lanes[status.name]
        host = request.url.hostname or "127.0.0.1"
        shown = f"[{host}]" if ":" in host else host
        return {
            **status.to_json(),
            "unit": unit_name(status.name, spec),
            "group": spec.group,
            "port": spec.port,
            "served_model_name": spec.served_model_name,
            "base_url": f"http://{shown}:{spec.port}/v1",
            "engine": supervisor.engine_summary(status.name),
            "startup": status.startup(supervisor.clock()),
            "container": await container_view(status.name),
        }

    def lane_status(lane: str) -> LaneStatus:
        try:
            supervisor.spec(lane)
        except UnknownLane as exc:
            raise ApiError(404, exc.code, exc.message, exc.hint) from None
        return supervisor.statuses[lane]

    async def answer(
        lane: str,
        future: asyncio.Future[LaneStatus],
        wait: bool,
        timeout: float | None,
        request: Request,
    ) -> JSONResponse:
        if not wait:
            return JSONResponse(await view(supervisor.statuses[lane], request), status_code=202)
        try:
            status = await asyncio.wait_for(asyncio.shield(future), timeout)
        except asyncio.TimeoutError:
            raise ApiError(
                504,
                "timeout",
                f"lane {lane} is not done after {timeout:g}s",
                f"it goes on; see GET /lanes/{lane}",
            ) from None
        except Superseded as exc:
            raise ApiError(409, exc.code, exc.message, exc.hint) from None
        except PreflightFailed as exc:
            raise ApiError(
                409, exc.code, exc.message, exc.hint, {"findings": findings_json(exc.findings)}
            ) from None
        except (ActivationFailed, LaneError) as exc:
            raise ApiError(502, exc.code, exc.message, exc.hint) from None
        return JSONResponse(await view(status, request), status_code=200)

    @app.get("/healthz")
    async def healthz() -> dict[str, str]:
        """laned itself is up."""
        return {"status": "ok", "version": __version__}

    @app.get("/lanes")
    async def lanes(request: Request) -> dict[str, Any]:
        """Every lane with its state."""
        return {
            "lanes": [
                await view(supervisor.statuses[n], request) for n in sorted(supervisor.statuses)
            ]
        }

    @app.get("/lanes/{lane}")
    async def lane(lane: str, request: Request) -> dict[str, Any]:
        """One lane: state, desired, reason, phase, restarts, last exit, where to reach it."""
        return await view(lane_status(lane), request)

    @app.get("/lanes/{lane}/preflight")
    async def preflight(lane: str) -> dict[str, Any]:
        """Would the lane start now? Every finding, errors first (run before each activation too)."""
        lane_status(lane)
        return report(lane, await supervisor.preflight(lane))

    @app.post("/lanes/{lane}/check")
    async def check(
        lane: str,
        gate: Annotated[
            list[str] | None, Query(description="gates to run (default: all six)")
        ] = None,
    ) -> dict[str, Any]:
        """Run the acceptance gates against the lane (load, chat, reasoning, tools, context,
        speed); the results are kept, shown in the lane's view and exported as metrics."""
        lane_status(lane)
        wanted = gate or list(GATES)
        unknown = [g for g in wanted if g not in GATES]
        if unknown:
            raise ApiError(
                400,
                "bad-request",
                f"gate: unknown gate {unknown[0]!r}",
                "gates: " + ", ".join(GATES),
            )
        try:
            return await supervisor.check(lane, wanted)
        except LaneNotRunning as exc:
            raise ApiError(409, exc.code, exc.message, exc.hint) from None

    @app.get("/fit")
    async def host_fit() -> dict[str, Any]:
        """Which configured lanes this host can run at all (their `needs` against its GPUs,
        memory and disks)."""
        if supervisor.host is None:
            memory = meminfo()
            host = HostFacts(
                None, "not read: laned runs without its host adapter", memory.get("MemTotal")
            )
        else:
            host = await supervisor.host.facts()
        return fit_report(supervisor.config.lanes, host)

    @app.get("/lanes/{lane}/activate", status_code=202, operation_id="activate_get")
    @app.post("/lanes/{lane}/activate", status_code=202, operation_id="activate_post")
    async def activate(
        lane: str,
        request: Request,
        wait: bool = Query(False, description="answer when the lane is ready (or failed)"),
        timeout: float | None = Query(None, gt=0, le=86400, description="seconds to wait at most"),
        force: bool = Query(False, description="start even when preflight finds errors"),
    ) -> JSONResponse:
        """Make the lane the running lane of its group (stopping the others). Idempotent.
        Preflight runs first; its errors refuse the activation before anything is stopped."""
        status = lane_status(lane)
        starting = status.desired is Desired.ACTIVE and status.state in RUNNING_STATES
        findings = None
        if not force and not starting:
            # Refuse at once, so that `curl .../activate` without wait hears why too; the
            # activation then uses these findings instead of running preflight again.
            findings = await supervisor.preflight(lane)
            if blocking(findings):
                message, hint = refusal(lane, findings)
                raise ApiError(
                    409, PreflightFailed.code, message, hint, {"findings": findings_json(findings)}
                )
        future = supervisor.activate(lane, force=force, findings=findings)
        return await answer(lane, future, wait, timeout, request)

    @app.get("/lanes/{lane}/deactivate", status_code=202, operation_id="deactivate_get")
    @app.post("/lanes/{lane}/deactivate", status_code=202, operation_id="deactivate_post")
    async def deactivate(
        lane: str,
        request: Request,
        wait: bool = Query(False, description="answer when the lane has stopped"),
        timeout: float | None = Query(None, gt=0, le=86400),
    ) -> JSONResponse:
        """Stop the lane; never counted as a failure."""
        lane_status(lane)
        return await answer(lane, supervisor.deactivate(lane), wait, timeout, request)

    @app.post("/lanes/{lane}/restart", status_code=202)
    async def restart(
        lane: str,
        request: Request,
        wait: bool = Query(False),
        timeout: float | None = Query(None, gt=0, le=86400),
    ) -> JSONResponse:
        """Stop and start the lane again."""
        lane_status(lane)
        return await answer(lane, supervisor.restart(lane), wait, timeout, request)

    @app.post("/reload")
    async def reload() -> dict[str, Any]:
        """Re-read the config, validate, re-render, daemon-reload; a bad config changes nothing."""
        try:
            new = await asyncio.to_thread(load_config, supervisor.config.source)
            result = await supervisor.reload(new)
        except ConfigError as exc:
            metrics.reload("invalid")
            raise ApiError(
                400,
                "bad-config",
                str(exc),
                "fix the file and POST /reload again; the running config stays in force",
            ) from None
        except ConfigRefused as exc:
            metrics.reload("refused")
            raise ApiError(409, exc.code, exc.message, exc.hint) from None
        metrics.reload("applied")
        return result

    @app.get("/metrics")
    async def prometheus_metrics() -> Response:
        """laned's own metrics (Prometheus text format); no token needed."""
        return Response(metrics.render(), media_type="text/plain; version=0.0.4; charset=utf-8")

    @app.get("/sd")
    async def service_discovery(request: Request) -> list[dict[str, Any]]:
        """Prometheus HTTP service discovery: the running lanes' engine /metrics endpoints."""
        host = request.url.hostname or "127.0.0.1"
        shown = f"[{host}]" if ":" in host else host
        targets = []
        for name, status in sorted(supervisor.statuses.items()):
            if status.state not in RUNNING_STATES:
                continue
            spec = supervisor.config.lanes[name]
            labels = {"lane": name, "model": spec.served_model_name, "unit": unit_name(name, spec)}
            targets.append({"targets": [f"{shown}:{spec.port}"], "labels": labels})
        return targets

    @app.get("/events", response_model=None)
    async def events(
        request: Request,
        limit: int = Query(100, ge=1, le=500),
        lane: str | None = None,
        follow: bool = Query(False, description="stream new transitions as Server-Sent Events"),
    ) -> dict[str, Any] | StreamingResponse:
        """Recent transitions, oldest first; with follow=true, then every new one as it happens."""
        if lane is not None:
            lane_status(lane)
        chosen = [e for e in supervisor.events if lane is None or e.lane == lane][-limit:]
        if not follow:
            return {"events": [e.to_json() for e in chosen]}
        queue: asyncio.Queue[Event] = asyncio.Queue(maxsize=1000)

        def listener(event: Event) -> None:
            if (lane is None or event.lane == lane) and not queue.full():
                queue.put_nowait(event)

        async def stream() -> AsyncIterator[bytes]:
            supervisor.listeners.append(listener)
            try:
                for event in chosen:
                    yield b"data: " + json.dumps(event.to_json()).encode() + b"\n\n"
                while not await request.is_disconnected():
                    try:
                        event = await asyncio.wait_for(queue.get(), 15)
                    except asyncio.TimeoutError:
                        yield b": keep-alive\n\n"
                        continue
                    yield b"data: " + json.dumps(event.to_json()).encode() + b"\n\n"
            finally:
                supervisor.listeners.remove(listener)

        return StreamingResponse(
            stream(), media_type="text/event-stream", headers={"Cache-Control": "no-cache"}
        )

    @app.get("/lanes/{lane}/logs")
    async def logs(
        lane: str,
        lines: int = Query(100, ge=1, le=10000),
        source: str = Query("journal", pattern="^(journal|container)$"),
    ) -> dict[str, Any]:
        """The engine's last log lines, from journald (or the running container's own log)."""
        spec = supervisor.config.lanes[lane_status(lane).name]
        if source == "journal":
            return {"lane": lane, "lines": await journal.tail(unit_name(lane, spec), lines)}
        if spec.container is None or supervisor.host is None:
            raise ApiError(
                400, "not-a-container", f"lane {lane} is not a container lane", "use source=journal"
            )
        try:
            tail = await supervisor.host.podman.logs(container_name(lane, spec), lines)
        except PodmanError as exc:
            raise ApiError(503, "podman-unavailable", exc.message, exc.hint) from None
        return {"lane": lane, "lines": tail}

    return app
