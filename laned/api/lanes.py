"""The lanes' endpoints: views, activate/deactivate/restart (with wait), preflight, checks, logs."""

from __future__ import annotations

import asyncio
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Query, Request
from fastapi.responses import JSONResponse

from laned.api.front import Front
from laned.api.guard import Access, Call, access
from laned.config.model import GATES
from laned.core.lanes import LaneStatus
from laned.errors import BadRequest, WaitTimedOut

NO_DRAIN = "stop without draining the requests in flight through laned's OpenAI endpoint"


def ranked(
    request: Request,
    rank_only: bool = Query(
        False, description="a lane over several hosts: this host's rank only (peers' call)"
    ),
) -> bool:
    """`rank_only` as the guard read and judged it (laned.api.guard.Call), not a second
    reading of the query."""
    return Call.of(request.scope).rank_only


def routes(api: APIRouter, front: Front) -> None:
    """The /lanes endpoints over one front, added to `api` (the application's own router)."""

    def host(request: Request) -> str:
        return request.url.hostname or "127.0.0.1"

    async def answer(
        lane: str,
        future: asyncio.Future[LaneStatus],
        wait: bool,
        timeout: float | None,
        request: Request,
    ) -> JSONResponse:
        """202 with the lane's view at once, or (wait) 200 when the request is done; its
        failure is a LanedError, answered through the error table."""
        if not wait:
            return JSONResponse(await front.view(lane, host(request)), status_code=202)
        try:
            await asyncio.wait_for(asyncio.shield(future), timeout)
        except asyncio.TimeoutError:
            raise WaitTimedOut(
                f"lane {lane} is not done after {timeout:g}s",
                f"it goes on; see GET /lanes/{lane}",
            ) from None
        return JSONResponse(await front.view(lane, host(request)), status_code=200)

    # Answered by laned.api.door before the router (the same function, the same bytes): this
    # route is the schema's, and answers a request that reaches the application directly.
    @api.get("/lanes", response_class=JSONResponse)
    @access(Access.READ)
    async def lanes(request: Request) -> JSONResponse:
        """Every lane with its state; `notices`: what laned itself meets (as in /healthz)."""
        return JSONResponse(await front.views(host(request)))

    @api.get("/lanes/{lane}", response_class=JSONResponse)
    @access(Access.READ, peers=True)
    async def lane(lane: str, request: Request) -> JSONResponse:
        """One lane: state, desired, reason, phase, restarts, last exit, where to reach it."""
        return JSONResponse(await front.view(lane, host(request)))

    @api.get("/lanes/{lane}/preflight")
    @access(Access.READ)
    async def preflight(lane: str) -> dict[str, Any]:
        """Would the lane start now? Every finding, errors first (run before each activation too)."""
        return await front.preflight(lane)

    @api.post("/lanes/{lane}/check")
    @access(Access.MUTATE)
    async def check(
        lane: str,
        gate: Annotated[
            list[str] | None, Query(description="gates to run (default: all six)")
        ] = None,
    ) -> dict[str, Any]:
        """Run the acceptance gates against the lane (load, chat, reasoning, tools, context,
        speed); the results are kept, shown in the lane's view and exported as metrics."""
        front.status(lane)
        wanted = gate or list(GATES)
        unknown = [g for g in wanted if g not in GATES]
        if unknown:
            raise BadRequest(
                f"gate: unknown gate {unknown[0]!r}",
                "gates: " + ", ".join(GATES),
            )
        return await front.check(lane, wanted)

    @api.get("/lanes/{lane}/activate", status_code=202, operation_id="activate_get")
    @api.post("/lanes/{lane}/activate", status_code=202, operation_id="activate_post")
    @access(Access.MUTATE, peers=True)
    async def activate(
        lane: str,
        request: Request,
        rank_only: Annotated[bool, Depends(ranked)],
        wait: bool = Query(False, description="answer when the lane is ready (or failed)"),
        timeout: float | None = Query(None, gt=0, le=86400, description="seconds to wait at most"),
        force: bool = Query(
            False,
            description="start even when preflight finds errors; stop the others without "
            "draining the requests in flight through laned's OpenAI endpoint",
        ),
    ) -> JSONResponse:
        """Make the lane the running lane of its group (stopping the others, after their
        requests at laned's OpenAI endpoint end). Idempotent. Preflight runs first; its
        errors refuse the activation before anything is stopped."""
        future = await front.activate(lane, force, rank_only=rank_only)
        return await answer(lane, future, wait, timeout, request)

    @api.get("/lanes/{lane}/deactivate", status_code=202, operation_id="deactivate_get")
    @api.post("/lanes/{lane}/deactivate", status_code=202, operation_id="deactivate_post")
    @access(Access.MUTATE, peers=True)
    async def deactivate(
        lane: str,
        request: Request,
        rank_only: Annotated[bool, Depends(ranked)],
        wait: bool = Query(False, description="answer when the lane has stopped"),
        timeout: float | None = Query(None, gt=0, le=86400),
        force: bool = Query(False, description=NO_DRAIN),
    ) -> JSONResponse:
        """Stop the lane (never counted as a failure), after the requests in flight through
        laned's OpenAI endpoint end (the lane's drain_timeout at most)."""
        future = await front.deactivate(lane, force, rank_only=rank_only)
        return await answer(lane, future, wait, timeout, request)

    @api.post("/lanes/{lane}/restart", status_code=202)
    @access(Access.MUTATE, peers=True)
    async def restart(
        lane: str,
        request: Request,
        rank_only: Annotated[bool, Depends(ranked)],
        wait: bool = Query(False),
        timeout: float | None = Query(None, gt=0, le=86400),
        force: bool = Query(False, description=NO_DRAIN),
    ) -> JSONResponse:
        """Stop and start the lane again, after its requests at laned's OpenAI endpoint end."""
        future = await front.restart(lane, force, rank_only=rank_only)
        return await answer(lane, future, wait, timeout, request)

    @api.post("/lanes/{lane}/rank-sleep")
    @access(Access.MUTATE, peers=True)
    async def rank_sleep(
        lane: str,
        rank_only: Annotated[bool, Depends(ranked)],
        step: str = Query(..., pattern="^(before|after)$"),
        level: int = Query(1, ge=1, le=2),
    ) -> dict[str, Any]:
        """A worker's rank as its head's engine sleeps every rank (peers' call, rank_only):
        `before`, it reads what it holds; `after`, it confirms it holds less and sleeps as a
        sleeper of this host (409 rank-not-asleep: why not)."""
        if not rank_only:
            raise BadRequest(
                f"rank-sleep of lane {lane} is a peer's call for this host's rank",
                "only a head's laned calls it, with rank_only=true and the peer token",
            )
        return await front.rank_sleep(lane, step, level)

    @api.get("/lanes/{lane}/logs")
    @access(Access.READ)
    async def logs(
        lane: str,
        lines: int = Query(100, ge=1, le=10000),
        source: str = Query("journal", pattern="^(journal|container)$"),
    ) -> dict[str, Any]:
        """The engine's last log lines, from journald (or the running container's own log)."""
        return {"lane": lane, "lines": await front.logs(lane, lines, source)}
