"""laned's OpenAI endpoint: one base URL for every lane, a request routed by its `model`.

`POST /v1/...` goes to the lane whose `served_model_name` (or one of its `aliases`) the body
names, byte for byte and chunk by chunk (SSE passes through unbuffered); the client's
`Authorization` travels unchanged to the engine and is never logged. A lane that does not
serve answers 503 with Retry-After, in OpenAI's error shape, saying its state and how to
activate it. One pooled connection set to the engines, no new connection per request.

A request for a lane that is on its way to serving (starting, restarting, a swap towards
it) waits in a bounded queue (`proxy.queue_limit`, `proxy.queue_timeout`) and goes through
once it is ready; a lane that fails meanwhile answers its waiters at once. Activation on
demand and draining before a stop come next (issue 13); docs/proxy.md says what works today.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Mapping
from typing import Any

import httpx
from starlette.background import BackgroundTask
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from laned import policy
from laned.errors import LanedError
from laned.front import Front
from laned.lanes import Desired, LaneState, LaneStatus
from laned.model import Config
from laned.probes import ENGINE_POOL

# Request headers that travel to the engine; hop-by-hop ones and Host do not.
FORWARDED = ("authorization", "content-type", "accept", "openai-organization", "openai-project")
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


def worth_waiting(status: LaneStatus) -> bool:
    """A request for a lane that is on its way to serving waits for it: starting, restarting,
    or desired active while the swap towards it stops its peers."""
    return status.desired is Desired.ACTIVE and status.state in (
        LaneState.STARTING,
        LaneState.RESTARTING,
        LaneState.INACTIVE,
        LaneState.STOPPING,
    )


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

    def __init__(self, front: Front) -> None:
        self.front = front
        self.queued: dict[str, int] = {}  # requests waiting for each lane
        # Pooled connections given up before the engine's 5 s idle close (as the probes do);
        # no read timeout: a long answer streams for as long as it takes.
        self.client = httpx.AsyncClient(
            timeout=httpx.Timeout(None, connect=5.0), limits=ENGINE_POOL
        )

    async def close(self) -> None:
        """Close the pooled connections."""
        await self.client.aclose()

    def models(self) -> dict[str, Any]:
        """GET /v1/models: every configured model (aliases too), with its lane's state."""
        config = self.front.supervisor.config
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
                        },
                    }
                )
        return {"object": "list", "data": data}

    async def forward(self, request: Request, path: str) -> Response:
        """Route a POST /v1/{path} by its model and stream the engine's answer back."""
        body = await request.body()
        try:
            parsed = json.loads(body) if body else None
        except ValueError:
            parsed = None
        model = parsed.get("model") if isinstance(parsed, dict) else None
        config = self.front.supervisor.config
        known = sorted({n for lane in config.lanes for n in model_names(config, lane)})
        if not isinstance(model, str) or not model:
            return openai_error(400, "BadRequestError", "the request names no `model`", models=known)  # fmt: skip
        lane = route(config, self.front.statuses, model)
        if lane is None:
            return openai_error(
                404,
                "NotFoundError",
                f"The model `{model}` does not exist. laned serves: {', '.join(known)}.",
            )
        status = self.front.status(lane)
        if status.state not in SERVING:
            if not worth_waiting(status):
                return self._not_serving(lane, status)
            refused = await self._wait(lane, status)
            if refused is not None:
                return refused
        spec = config.lanes[lane]
        if model != spec.served_model_name and isinstance(parsed, dict):
            # An alias is laned's name: the engine knows the lane's served model name.
            body = json.dumps({**parsed, "model": spec.served_model_name}).encode()
        headers = {k: v for k, v in request.headers.items() if k.lower() in FORWARDED}
        upstream = self.client.build_request(
            "POST",
            f"http://127.0.0.1:{spec.port}/v1/{path}",
            content=body,
            headers=headers,
            params=request.query_params,
        )
        try:
            answer = await self.client.send(upstream, stream=True)
        except httpx.HTTPError as exc:
            return openai_error(
                502,
                "BadGatewayError",
                f"lane {lane} did not answer on port {spec.port}: {type(exc).__name__}",
                lane=lane,
                hint=f"laned status; laned logs {lane}",
            )
        passed = {k: v for k, v in answer.headers.items() if k.lower() in ("content-type",)}
        return StreamingResponse(
            _chunks(answer),
            status_code=answer.status_code,
            headers=passed,
            background=BackgroundTask(answer.aclose),
        )

    async def _wait(self, lane: str, status: LaneStatus) -> JSONResponse | None:
        """Wait in the lane's queue until it is ready; an answer that says why not, or None."""
        config = self.front.supervisor.config
        settings = config.lanes[lane].proxy or config.daemon.proxy
        waiting = self.queued.get(lane, 0)
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
        self.queued[lane] = waiting + 1
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
            return openai_error(
                503,
                "ServiceUnavailableError",
                f"lane {lane} will not serve: {exc.message}",
                lane=lane,
                state=self.front.status(lane).state.value,
                hint=exc.hint,
            )
        finally:
            self.queued[lane] -= 1
        return None

    def _not_serving(self, lane: str, status: LaneStatus) -> JSONResponse:
        why = status.phase or (status.reason if status.state is LaneState.FAILED else None)
        return openai_error(
            503,
            "ServiceUnavailableError",
            f"lane {lane} is {status.state.value}" + (f" ({why})" if why else "") + ", not serving",
            lane=lane,
            state=status.state.value,
            phase=status.phase,
            progress=status.progress,
            retry_after=RETRY_AFTER,
            hint=f"activate it: curl -s localhost:9000/lanes/{lane}/activate",
        )


async def _chunks(answer: httpx.Response) -> AsyncIterator[bytes]:
    """The engine's body as it comes; closing it (a client that went away) ends the
    engine's request too, since vLLM aborts a request whose connection closes."""
    try:
        async for chunk in answer.aiter_raw():
            yield chunk
    finally:
        await answer.aclose()
