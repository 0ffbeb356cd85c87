"""laned's OpenAI endpoint: one base URL for every lane, a request routed by its `model`.

`POST /v1/...` goes to the lane whose `served_model_name` (or one of its `aliases`) the body
names, byte for byte and chunk by chunk (SSE passes through unbuffered); the client's
`Authorization` travels unchanged to the engine and is never logged. A lane that does not
serve answers 503 with Retry-After, in OpenAI's error shape, saying its state and how to
activate it. One pooled connection set to the engines, no new connection per request.

A request for a lane that is on its way to serving (starting, restarting, a swap towards
it) waits in a bounded queue (`proxy.queue_limit`, `proxy.queue_timeout`) and goes through
once it is ready; a lane that fails meanwhile answers its waiters at once. A lane with
`on_demand = true` is activated by a request for its model (a swap), which then waits.

Every request sent to an engine is counted in flight (`laned.owner.traffic`) until its answer
ends, so that the owner can drain a lane before it stops it: a stopping lane gets no new
request, and the ones in flight finish (up to its `drain_timeout`).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Mapping
from typing import Any
from urllib.parse import unquote

import aiohttp
from starlette.background import BackgroundTask
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from laned.adapters.probes import ENGINE_KEEP_ALIVE
from laned.api.front import Front
from laned.config.model import Config
from laned.core import policy
from laned.core.lanes import Desired, LaneState, LaneStatus
from laned.core.recorder import Recorder
from laned.errors import LanedError
from laned.owner.traffic import Flight

# Request headers that travel to the engine; hop-by-hop ones and Host do not. The answer's
# body passes as the engine sent it, so its encoding travels back with it.
FORWARDED = (
    "authorization", "content-type", "accept", "accept-encoding",
    "openai-organization", "openai-project",
)  # fmt: skip
RETURNED = ("content-type", "content-encoding")
SERVING = (LaneState.READY, LaneState.DEGRADED)
RETRY_AFTER = 30  # seconds, for a lane not on its way to serving or a full queue


def model_names(config: Config, lane: str) -> list[str]:
    """The names a lane answers to: its served model name, then its aliases."""
    spec = config.lanes[lane]
    return [spec.served_model_name, *spec.aliases]


def route(config: Config, statuses: Mapping[str, LaneStatus], model: str) -> str | None:
    """The lane a request for `model` goes to: of the lanes that answer to the name, the one
    desired active (lanes of one group may be configurations of one model), else one that
    runs, else the first by name; None when no lane answers to it."""
    named = sorted(lane for lane in config.lanes if model in model_names(config, lane))
    desired = [n for n in named if statuses[n].desired is Desired.ACTIVE]
    running = [n for n in named if statuses[n].state in policy.HOLDING_STATES]
    return next(iter(desired or running or named), None)


def under_v1(path: str) -> bool:
    """Whether /v1/`path` stays under /v1: no `..` or `.` segment and no backslash, however
    often percent-encoded (the engine's client would decode "%2e%2e" and climb out)."""
    while (decoded := unquote(path)) != path:
        path = decoded
    return "\\" not in path and not any(part in (".", "..") for part in path.split("/"))


def worth_waiting(status: LaneStatus) -> bool:
    """A request for a lane that is on its way to serving waits for it: starting (a wake
    from sleep included), restarting, or desired active while the swap towards it stops its
    peers (it may still sleep meanwhile: never sent to a sleeping engine)."""
    return status.desired is Desired.ACTIVE and status.state in (
        LaneState.STARTING,
        LaneState.RESTARTING,
        LaneState.INACTIVE,
        LaneState.STOPPING,
        LaneState.SLEEPING,
    )


def on_demand_refusal(on_demand: bool, status: LaneStatus, under_way: str | None) -> str | None:
    """Why a request may not activate its lane (None: it may). Only a lane that says
    `on_demand = true`; never one that failed (a crash loop must not be restarted by every
    retry of a client: an operator activates it); never against an operation under way in
    its group (two on-demand lanes would take the GPUs from each other's waiting requests)."""
    if not on_demand:
        return "on_demand is off for it"
    if status.state is LaneState.FAILED:
        return "it failed, and on_demand does not start a failed lane again"
    if under_way is not None:
        return f"{under_way} is under way in its group"
    return None


def openai_error(status: int, kind: str, message: str, **extra: Any) -> JSONResponse:
    """OpenAI's error shape, as vLLM answers it, with laned's detail under `laned`."""
    body: dict[str, Any] = {
        "error": {"message": message, "type": kind, "param": None, "code": status}
    }
    if extra:
        body["error"]["laned"] = extra
    headers = {"Retry-After": str(extra["retry_after"])} if "retry_after" in extra else None
    return JSONResponse(body, status_code=status, headers=headers)


class Proxy:
    """Forwards OpenAI requests to the lanes' engines."""

    def __init__(self, front: Front, recorder: Recorder | None = None) -> None:
        self.front = front
        self.traffic = front.traffic
        self.recorder = recorder or Recorder()
        self._demand: dict[str, asyncio.Task[Any]] = {}  # on-demand activations under way
        self._session: aiohttp.ClientSession | None = None

    @property
    def session(self) -> aiohttp.ClientSession:
        """The pooled connections to the engines (made on the running loop at first use).

        aiohttp rather than httpx (which the probes use): its C parser and plain asyncio
        streams relay a streamed answer for half of httpx's CPU per chunk (bench/proxy.py,
        docs/proxy.md). Connections are given up before the engine's 5 s idle close (as the
        probes do); no read timeout: a long answer streams for as long as it takes. No
        headers of aiohttp's own: the engine sees what the client sent."""
        if self._session is None:
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=0, keepalive_timeout=ENGINE_KEEP_ALIVE / 2),
                timeout=aiohttp.ClientTimeout(total=None, sock_connect=5.0),
                auto_decompress=False,
                skip_auto_headers=("Accept-Encoding", "User-Agent"),
            )
        return self._session

    async def close(self) -> None:
        """Close the pooled connections."""
        if self._session is not None:
            await self._session.close()

    def models(self) -> dict[str, Any]:
        """GET /v1/models: every configured model (aliases too), with its lane's state."""
        config = self.front.config
        data = []
        for lane in self.front.lanes():
            status = self.front.status(lane)
            for name in model_names(config, lane):
                data.append(
                    {
                        "id": name,
                        "object": "model",
                        "owned_by": "laned",
                        "laned": {
                            "lane": lane,
                            "state": status.state.value,
                            "phase": status.phase,
                            "progress": status.progress,
                            "on_demand": config.lanes[lane].on_demand,
                        },
                    }
                )
        return {"object": "list", "data": data}

    async def forward(self, request: Request, path: str) -> Response:
        """Route a POST /v1/{path} by its model and stream the engine's answer back. Only
        under /v1: a path that climbs out ("/v1/../sleep", percent-encoded or not) would
        reach the engine's other routes, vLLM's dev routes among them (docs/sleep.md)."""
        if not under_v1(path):
            message = f"/v1/{path} is not an endpoint laned forwards"
            return self._answer("none", openai_error(404, "NotFoundError", message))
        body = await request.body()
        began = time.perf_counter()
        try:
            parsed = json.loads(body) if body else None
        except ValueError:
            parsed = None
        model = parsed.get("model") if isinstance(parsed, dict) else None
        config = self.front.config
        known = sorted({n for lane in config.lanes for n in model_names(config, lane)})
        if not isinstance(model, str) or not model:
            return self._answer("none", openai_error(400, "BadRequestError", "the request names no `model`", models=known))  # fmt: skip
        lane = route(config, self.front.statuses, model)
        if lane is None:
            message = f"The model `{model}` does not exist. laned serves: {', '.join(known)}."
            return self._answer("none", openai_error(404, "NotFoundError", message))
        refused, waited = await self._admit(lane, model)
        if refused is not None:
            return self._answer(lane, refused)
        # No await from admission to here: a drain that begins later counts this request.
        flight = self.traffic.enter(lane)
        spec = config.lanes[lane]
        if model != spec.served_model_name and isinstance(parsed, dict):
            # An alias is laned's name: the engine knows the lane's served model name.
            body = json.dumps({**parsed, "model": spec.served_model_name}).encode()
        headers = {k: v for k, v in request.headers.items() if k.lower() in FORWARDED}
        self.recorder.proxy_overhead(lane, time.perf_counter() - began - waited)
        try:
            answer = await self.session.post(
                f"http://127.0.0.1:{spec.port}/v1/{path}",
                data=body,
                headers=headers,
                params=list(request.query_params.multi_items()),
            )
        except (aiohttp.ClientError, OSError) as exc:
            flight.done()
            return self._answer(lane, openai_error(
                502,
                "BadGatewayError",
                f"lane {lane} did not answer on port {spec.port}: {type(exc).__name__}",
                lane=lane,
                hint=f"laned status; laned logs {lane}",
            ))  # fmt: skip
        self.recorder.proxy_answer(lane, answer.status)
        passed = {k: v for k, v in answer.headers.items() if k.lower() in RETURNED}
        return StreamingResponse(
            _chunks(answer, flight),
            status_code=answer.status,
            headers=passed,
            # Also when the body never started (a client gone before the first chunk).
            background=BackgroundTask(_end, answer, flight),
        )

    def _answer(self, lane: str, response: JSONResponse) -> JSONResponse:
        self.recorder.proxy_answer(lane, response.status_code)
        return response

    async def _admit(self, lane: str, model: str) -> tuple[JSONResponse | None, float]:
        """None when the lane serves now (after a wait in its queue, or an activation on
        demand), else the answer that says why not; and the seconds it waited."""
        status = self.front.status(lane)
        if status.state in SERVING:
            return None, 0.0
        if not worth_waiting(status):
            spec = self.front.config.lanes[lane]
            why = on_demand_refusal(spec.on_demand, status, self.front.under_way(lane))
            if why is not None:
                return self._not_serving(lane, status, why), 0.0
            refused = await self._activate_on_demand(lane, model)
            if refused is not None:
                return refused, 0.0
        began = time.perf_counter()
        refused = await self._wait(lane, self.front.status(lane))
        waited = time.perf_counter() - began
        self.recorder.proxy_queue_wait(lane, waited)
        if refused is None and (now := self.front.status(lane)).state not in SERVING:
            # Ready, then stopped again (a swap away) before this request's turn came.
            refused = self._not_serving(lane, now)
        return refused, waited

    async def _activate_on_demand(self, lane: str, model: str) -> JSONResponse | None:
        """Activate the lane for a request (one activation for all that ask meanwhile)."""
        task = self._demand.get(lane)
        if task is None:
            task = asyncio.ensure_future(
                self.front.activate(lane, reason=f"on demand: a request for {model}")
            )
            self._demand[lane] = task
            task.add_done_callback(lambda _: self._demand.pop(lane, None))
        try:
            activation = await asyncio.shield(task)
        except LanedError as exc:  # preflight refused it: nothing was stopped
            return self._refused_by(lane, "cannot be activated on demand", exc)
        # Its waiters hear how it ends; the future's own error needs no reader.
        activation.add_done_callback(_quiet)
        return None

    async def _wait(self, lane: str, status: LaneStatus) -> JSONResponse | None:
        """Wait in the lane's queue until it is ready; an answer that says why not, or None."""
        config = self.front.config
        settings = config.lanes[lane].proxy or config.daemon.proxy
        waiting = self.traffic.queued(lane)
        if waiting >= settings.queue_limit:
            return openai_error(
                503,
                "ServiceUnavailableError",
                f"lane {lane} is {status.state.value} and {waiting} request(s) already wait for it "
                f"(queue_limit {settings.queue_limit})",
                lane=lane,
                state=status.state.value,
                retry_after=RETRY_AFTER,
                hint="try again later, or raise proxy.queue_limit",
            )
        self.traffic.wait_begins(lane)
        try:
            ready = self.front.wait_ready(lane)
            await asyncio.wait_for(asyncio.shield(ready), settings.queue_timeout)
        except asyncio.TimeoutError:
            now = self.front.status(lane)
            return openai_error(
                504,
                "GatewayTimeoutError",
                f"lane {lane} was not ready within queue_timeout ({settings.queue_timeout:g} s): "
                f"it is {now.state.value}",
                lane=lane,
                state=now.state.value,
                phase=now.phase,
                hint=f"laned status; laned events --lane {lane}",
            )
        except LanedError as exc:  # it failed, or a newer request stopped it
            return self._refused_by(lane, "will not serve", exc)
        finally:
            self.traffic.wait_ends(lane)
        return None

    def _refused_by(self, lane: str, what: str, exc: LanedError) -> JSONResponse:
        """503 for a lane that laned's error says will not serve this request."""
        return openai_error(
            503,
            "ServiceUnavailableError",
            f"lane {lane} {what}: {exc.message}",
            lane=lane,
            state=self.front.status(lane).state.value,
            hint=exc.hint,
        )

    def _not_serving(self, lane: str, status: LaneStatus, why_not: str = "") -> JSONResponse:
        why = status.phase or status.reason
        return openai_error(
            503,
            "ServiceUnavailableError",
            f"lane {lane} is {status.state.value}"
            + (f" ({why})" if why else "")
            + ", not serving"
            + (f"; a request does not activate it: {why_not}" if why_not else ""),
            lane=lane,
            state=status.state.value,
            phase=status.phase,
            progress=status.progress,
            retry_after=RETRY_AFTER,
            hint=f"activate it: curl -s localhost:9000/lanes/{lane}/activate",
        )


async def _chunks(answer: aiohttp.ClientResponse, flight: Flight) -> AsyncIterator[bytes]:
    """The engine's body as it comes; closing it (a client that went away) ends the
    engine's request too, since vLLM aborts a request whose connection closes."""
    try:
        async for chunk in answer.content.iter_any():
            yield chunk
    finally:
        await _end(answer, flight)


async def _end(answer: aiohttp.ClientResponse, flight: Flight) -> None:
    """The answer is over, no longer in flight (idempotent): its connection goes back to the
    pool when the body was read to its end, else it is closed (the engine aborts then)."""
    flight.done()
    if answer.content.at_eof():
        answer.release()
    else:
        answer.close()


def _quiet(future: asyncio.Future[Any]) -> None:
    if not future.cancelled():
        future.exception()
