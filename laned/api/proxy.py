"""laned's OpenAI endpoint: one base URL for every lane, a request routed by its `model`.

`POST /v1/...` goes to the lane whose `served_model_name` (or one of its `aliases`) the body
names, byte for byte and chunk by chunk (SSE passes through unbuffered); the client's
`Authorization` travels unchanged to the engine and is never logged. A lane that does not
serve answers 503 with Retry-After, in OpenAI's error shape, saying its state and how to
activate it. One pooled connection set to the engines, no new connection per request.

A request for a lane that is on its way to serving (starting, restarting, a swap towards
it), or for an `on_demand` lane of a group that another lane holds, waits in the lane's
bounded queue (`proxy.queue_limit`, `proxy.queue_timeout`) for its turn: the owner's
scheduler (laned.owner.scheduler, laned.core.schedule) decides when a group swaps for its
waiting requests. A lane that fails meanwhile answers its waiters at once.

Every request sent to an engine is counted in flight (`laned.owner.traffic`) until its answer
ends, so that the owner can drain a lane before it stops it: a stopping lane gets no new
request, and the ones in flight finish (up to its `drain_timeout`).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Mapping
from typing import Any
from urllib.parse import unquote

from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.types import Receive, Scope, Send

from laned.adapters.body_parser import BodyParser
from laned.adapters.upstream import Answer, Pool
from laned.api.budget import Claim
from laned.api.front import Front
from laned.api.limits import BUDGET_KEY
from laned.api.loading import EVERY, Progress, error_event, progress_line
from laned.config.listener import api_address
from laned.config.model import Config
from laned.core import policy
from laned.core.lanes import Desired, LaneStatus
from laned.core.recorder import Recorder
from laned.core.request_body import Body, Peek, with_model
from laned.core.schedule import Admission, Verdict
from laned.errors import BodyParserLost, BodyTooDeep, EngineBrokeOff
from laned.owner.traffic import Flight

# Request headers that travel to the engine; hop-by-hop ones and Host do not. The answer's
# body passes as the engine sent it, so its encoding travels back with it.
FORWARDED = (
    "authorization",
    "content-type",
    "accept",
    "accept-encoding",
    "openai-organization",
    "openai-project",
)
FORWARDED_NAMES = frozenset(name.encode() for name in FORWARDED)  # as the server hands them
# A body with a length keeps it (no chunked encoding added on the way); a chunked one stays so.
RETURNED = frozenset((b"content-type", b"content-encoding", b"content-length"))
Headers = list[tuple[bytes, bytes]]
RETRY_AFTER = 30  # seconds, for a lane not on its way to serving or a full queue


def model_names(config: Config, lane: str) -> list[str]:
    """The names a lane answers to: its served model name, then its aliases."""
    spec = config.lanes[lane]
    return [spec.served_model_name, *spec.aliases]


_INDEX: dict[int, tuple[Config, dict[str, list[str]]]] = {}  # per config: name -> its lanes


def lanes_named(config: Config) -> dict[str, list[str]]:
    """Each model name (aliases too) and the lanes that answer to it, sorted; built once per
    config (a reload makes a new one), not per request."""
    kept = _INDEX.get(id(config))
    if kept is None or kept[0] is not config:
        index: dict[str, list[str]] = {}
        for lane in sorted(config.lanes):
            for name in model_names(config, lane):
                index.setdefault(name, []).append(lane)
        _INDEX.clear()
        _INDEX[id(config)] = kept = (config, index)
    return kept[1]


def known_models(config: Config) -> list[str]:
    """Every model name laned serves, sorted (for the errors that list them)."""
    return sorted(lanes_named(config))


def route(config: Config, statuses: Mapping[str, LaneStatus], model: str) -> str | None:
    """The lane a request for `model` goes to: of the lanes that answer to the name, the one
    desired active (lanes of one group may be configurations of one model), else one that
    runs, else the first by name; None when no lane answers to it."""
    named = lanes_named(config).get(model, ())
    if len(named) == 1:
        return named[0]
    desired = [n for n in named if statuses[n].desired is Desired.ACTIVE]
    running = [n for n in named if statuses[n].state in policy.HOLDING_STATES]
    return next(iter(desired or running or named), None)


def under_v1(path: str) -> bool:
    """Whether /v1/`path` stays under /v1: no `..` or `.` segment and no backslash, however
    often percent-encoded (the engine's client would decode "%2e%2e" and climb out)."""
    while (decoded := unquote(path)) != path:
        path = decoded
    return "\\" not in path and not any(part in (".", "..") for part in path.split("/"))


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
        # The pooled connections to the engines (laned.adapters.upstream): no read timeout (a
        # long answer streams for as long as it takes), no headers of the client's own (the
        # engine sees what the client sent, with its own Host and Content-Length).
        self.pool = Pool()
        # A large body's model is read by a worker process, off the event loop.
        self.bodies = BodyParser()

    async def close(self) -> None:
        """Close the pooled connections and end the body parser's workers."""
        self.pool.close()
        await self.bodies.close()

    def models(self, states: bool = True) -> dict[str, Any]:
        """GET /v1/models: every configured model (aliases too), with its lane's state unless
        `states` is False (a caller who may not read laned's state: OpenAI's fields alone)."""
        config = self.front.config
        data = []
        for lane in self.front.lanes():
            status = self.front.status(lane)
            for name in model_names(config, lane):
                model: dict[str, Any] = {"id": name, "object": "model", "owned_by": "laned"}
                if states:
                    model["laned"] = {
                        "lane": lane,
                        "state": status.state.value,
                        "phase": status.phase,
                        "progress": status.progress,
                        "on_demand": config.lanes[lane].on_demand,
                    }
                data.append(model)
        return {"object": "list", "data": data}

    async def asgi(self, scope: Scope, receive: Receive, send: Send) -> None:
        """POST /v1/... as the server hands it over (laned.api.fast: no router, no
        StreamingResponse): routed by its model, the engine's answer relayed chunk by chunk
        as it comes, each with one `send`. Only under /v1: a path that climbs out
        ("/v1/../sleep", percent-encoded or not) would reach the engine's other routes,
        vLLM's dev routes among them (docs/sleep.md)."""
        path = scope["path"]
        if not under_v1(path[4:]):
            message = f"{path} is not an endpoint laned forwards"
            await self._answer("none", openai_error(404, "NotFoundError", message))(
                scope, receive, send
            )
            return
        claim: Claim | None = scope.get("extensions", {}).get(BUDGET_KEY)
        body = await _body(receive, scope, claim)
        if body is None:
            return  # the client went away (or the listener refused it) before its body came
        began = time.perf_counter()
        headers = [pair for pair in scope["headers"] if pair[0] in FORWARDED_NAMES]
        target = scope.get("raw_path") or path.encode()  # as the client sent it
        if query := scope.get("query_string", b""):
            target += b"?" + query
        prepared = self._prepare(path, target, body, headers, began, claim)
        del body  # held by _prepare alone from here (an alias rewrites it there)
        outcome = await prepared
        if isinstance(outcome, Response):
            await outcome(scope, receive, send)
        else:
            await _relay(*outcome, receive, send)

    async def _prepare(
        self,
        path: str,
        target: bytes,
        body: Body,
        headers: Headers,
        began: float,
        claim: Claim | None = None,
    ) -> Response | tuple[Answer, Flight]:
        """Route, admit (at once, or after a wait) and send the request to its engine: the
        engine's answer with the request counted in flight, or laned's own answer. `claim`:
        the body's share of the memory budget (laned.api.budget), given back once the body
        has gone to the engine."""
        try:
            peeked = await self.bodies.peek(body)
        except BodyTooDeep as exc:  # nested past the parser's depth (sys.getrecursionlimit())
            return self._answer(
                "none", openai_error(400, "BadRequestError", exc.message, limit="json depth")
            )
        except BodyParserLost as exc:
            return self._answer(
                "none",
                openai_error(
                    503, "ServiceUnavailableError", exc.message, retry_after=1, hint=exc.hint
                ),
            )
        model = peeked.model
        config = self.front.config
        if not model:
            return self._answer(
                "none",
                openai_error(
                    400,
                    "BadRequestError",
                    "the request names no `model`",
                    models=known_models(config),
                ),
            )
        lane = route(config, self.front.statuses, model)
        if lane is None:
            shown = model if len(model) <= 200 else model[:200] + "..."
            message = f"The model `{shown}` does not exist. laned serves: {', '.join(known_models(config))}."
            return self._answer("none", openai_error(404, "NotFoundError", message))
        spec = config.lanes[lane]
        served = self.front.engine_spec(lane).served_model_name  # as its engine started
        if model != served:
            # An alias is laned's name: the engine knows the lane's served model name.
            renamed = _renamed(body, peeked, served)
            if renamed is None:
                message = (
                    f"`{model}` is an alias of {served}: laned renames it in UTF-8 bodies only"
                )
                hint = f"send the body in UTF-8 (RFC 8259), or name the model {served}"
                return self._answer(lane, openai_error(400, "BadRequestError", message, hint=hint))
            body = renamed
        streamed = peeked.stream
        admission = self.front.admission(lane, self.traffic.clock())
        if (
            admission.verdict is Verdict.WAIT
            and spec.loading_state
            and path == "/v1/chat/completions"
            and streamed
        ):
            stream = self._loading(lane, model, target, body, headers, claim)
            return StreamingResponse(stream, media_type="text/event-stream")
        outcome, waited = await self._admit(lane, admission)
        if isinstance(outcome, JSONResponse):
            return self._answer(lane, outcome)
        flight = outcome  # counted in flight: a drain that begins now waits for it
        self.recorder.proxy_overhead(lane, time.perf_counter() - began - waited)
        answer = await self._post(lane, target, body, headers, claim)
        if isinstance(answer, JSONResponse):
            flight.done()
            return self._answer(lane, answer)
        return answer, flight

    async def _post(
        self, lane: str, target: bytes, body: Body, headers: Headers, claim: Claim | None
    ) -> Answer | JSONResponse:
        """Send the request to the lane's engine (`target`: the path and query as the client
        sent them): its answer (counted), or a 502. The body's claim on the memory budget is
        given back once the engine has answered (it has read the body) or could not."""
        port = self.front.engine_spec(lane).port  # a reload's new port waits for its restart
        try:
            answer = await self.pool.post(port, target, body, headers)
        except (OSError, asyncio.TimeoutError) as exc:
            return openai_error(
                502,
                "BadGatewayError",
                f"lane {lane} did not answer on port {port}: {type(exc).__name__}",
                lane=lane,
                hint=f"laned status; laned logs {lane}",
            )
        finally:
            if claim is not None:
                claim.release()
        self.recorder.proxy_answer(lane, answer.status)
        return answer

    async def _loading(
        self,
        lane: str,
        model: str,
        target: bytes,
        body: Body,
        headers: Headers,
        claim: Claim | None,
    ) -> AsyncIterator[bytes]:
        """A streaming chat request that waits, with the wait told in-band (laned.api.loading):
        a line each time it changes, then the engine's stream; an error as the last event."""
        progress = Progress(model)
        began = time.perf_counter()
        turn = asyncio.ensure_future(self._take_turn(lane))
        flight: Flight | None = None
        answer: Answer | JSONResponse | None = None
        try:
            shown = ""
            while not turn.done():
                line = progress_line(lane, self.front.status(lane), self.traffic.clock())
                if line != shown:
                    yield progress.chunk(line)
                    shown = line
                await asyncio.wait({turn}, timeout=EVERY)
            self.recorder.proxy_queue_wait(lane, time.perf_counter() - began)
            outcome = turn.result()
            if isinstance(outcome, JSONResponse):
                self.recorder.proxy_answer(lane, outcome.status_code)
                yield error_event(bytes(outcome.body))
                return
            flight = outcome
            answer = await self._post(lane, target, body, headers, claim)
            if isinstance(answer, JSONResponse):
                self.recorder.proxy_answer(lane, answer.status_code)
                yield error_event(bytes(answer.body))
            elif answer.status != 200:
                yield error_event(await answer.read())
            else:
                while chunk := await answer.chunk():
                    yield chunk
        finally:
            if not turn.done():
                turn.cancel()  # the client went away while it waited
            elif flight is None and not turn.cancelled() and turn.exception() is None:
                came = turn.result()
                if isinstance(came, Flight):
                    came.done()  # its turn came as the client went away
            if isinstance(answer, Answer) and flight is not None:
                _end(answer, flight)
            elif flight is not None:
                flight.done()

    def _answer(self, lane: str, response: JSONResponse) -> JSONResponse:
        self.recorder.proxy_answer(lane, response.status_code)
        return response

    async def _admit(self, lane: str, admission: Admission) -> tuple[JSONResponse | Flight, float]:
        """The request counted in flight when it may go to the lane's engine (at once, or
        after its turn in the lane's queue: laned.owner.scheduler), else the answer that
        says why not; and the seconds it waited."""
        if admission.verdict is Verdict.GO:
            return self.traffic.enter(lane), 0.0
        if admission.verdict is Verdict.REFUSE:
            status = self.front.status(lane)
            return self._not_serving(lane, status, admission.why, admission.hint), 0.0
        began = time.perf_counter()
        outcome = await self._take_turn(lane)
        waited = time.perf_counter() - began
        self.recorder.proxy_queue_wait(lane, waited)
        return outcome, waited

    async def _take_turn(self, lane: str) -> JSONResponse | Flight:
        """Wait in the lane's queue for its turn: the request counted in flight the moment
        it comes (no await between: a drain that begins later waits for it), or an answer
        that says why not."""
        config = self.front.config
        settings = config.lanes[lane].proxy or config.daemon.proxy
        waiting = self.traffic.queued(lane)
        status = self.front.status(lane)
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
        arrived = self.traffic.wait_begins(lane)
        try:
            turn = await self.front.turn(lane, arrived, settings.queue_timeout)
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
        finally:
            self.traffic.wait_ends(lane, arrived)
        if turn.verdict is Verdict.GO:
            return self.traffic.enter(lane)
        return openai_error(
            503,
            "ServiceUnavailableError",
            f"lane {lane} will not serve this request: {turn.why}",
            lane=lane,
            state=self.front.status(lane).state.value,
            retry_after=RETRY_AFTER,
            hint=turn.hint or f"laned status; laned events --lane {lane}",
        )

    def _not_serving(
        self, lane: str, status: LaneStatus, why_not: str = "", hint: str = ""
    ) -> JSONResponse:
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
            hint=hint
            or f"activate it: curl -s {api_address(self.front.config.daemon.listen)}/lanes/{lane}/activate",
        )


def _renamed(body: Body, peeked: Peek, served: str) -> bytes | None:
    """The body with its model named `served`, the rest as sent; None where laned cannot
    splice it (a body not in UTF-8)."""
    return None if peeked.span is None else with_model(body, peeked.span, served)


async def _body(receive: Receive, scope: Scope, claim: Claim | None) -> Body | None:
    """The request's whole body, as the server hands it over, held once and no more than it
    is: once its claim on the memory budget is held (the listener reads no more of it before),
    into a buffer of its declared length (a list of parts joined at the end held it twice, a
    buffer grown as it comes up to an eighth more); None when the client went away or the
    listener refused it for want of room first."""
    if claim is not None and not await claim.settled():
        return None
    declared = next((v for k, v in scope["headers"] if k == b"content-length"), b"")
    buffer = bytearray(int(declared)) if declared.isdigit() else bytearray()
    filled = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return None
        part = message.get("body", b"")
        buffer[filled : filled + len(part)] = part  # grows past the end (a chunked body)
        filled += len(part)
        if not message.get("more_body"):
            del buffer[filled:]  # the server ends a body at its declared length
            return buffer  # a bytearray: every reader of it takes bytes-like


async def _relay(answer: Answer, flight: Flight, receive: Receive, send: Send) -> None:
    """The engine's answer to the client as it comes: its status, its headers that travel,
    then what has come of its body since the last `send`, with one `send`, made as the
    engine's bytes arrive (Answer.pour: no task wakes per chunk). A client that goes
    away closes the engine's connection (vLLM aborts a request whose connection closes); an
    engine that breaks off mid-answer breaks the client's off too (the error propagates, the
    server closes it)."""
    gone = asyncio.ensure_future(_disconnect(receive))
    gone.add_done_callback(lambda done: None if done.cancelled() else answer.end())
    headers = [pair for pair in answer.headers if pair[0] in RETURNED]
    try:
        await send({"type": "http.response.start", "status": answer.status, "headers": headers})
        try:
            await answer.pour(
                lambda body: send({"type": "http.response.body", "body": body, "more_body": True})
            )
        except EngineBrokeOff:
            if not gone.done():
                raise  # the engine broke off: so does the answer
            return  # the client went away, and its engine connection with it
        await send({"type": "http.response.body", "body": b"", "more_body": False})
    finally:
        gone.cancel()
        _end(answer, flight)


async def _disconnect(receive: Receive) -> None:
    """Until the client goes away (the request's body is read already)."""
    while (await receive())["type"] != "http.disconnect":
        pass


def _end(answer: Answer, flight: Flight) -> None:
    """The answer is over, no longer in flight (idempotent): its connection goes back to the
    pool when the body was read to its end, else it is closed (the engine aborts then)."""
    flight.done()
    answer.end()
