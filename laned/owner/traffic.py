"""Requests at laned's OpenAI endpoint, per lane: in flight to its engine, and waiting for it.

The proxy (`laned.api.proxy`) counts; the owner (`laned.owner.supervisor`) drains a lane before it
stops it: it refuses new requests (the lane is `stopping`) and waits here until the
requests in flight have ended, up to the lane's `drain_timeout`. The scheduler
(`laned.owner.scheduler`) reads when each waiting request arrived and since when a lane has
been quiet, and hears (`news`) when a request begins to wait or a lane's last one ends.
Requests sent to an engine's port directly are not counted: laned does not see them.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable


class Flight:
    """One request in flight to a lane's engine; `done()` ends it, once, whoever calls it."""

    __slots__ = ("_done", "_traffic", "lane")

    def __init__(self, traffic: Traffic, lane: str) -> None:
        self._traffic, self.lane, self._done = traffic, lane, False

    def done(self) -> None:
        """The answer has ended (completed, failed, or the client went away)."""
        if not self._done:
            self._done = True
            self._traffic._leave(self.lane)


class Traffic:
    """Each lane's requests in flight and waiting."""

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self.clock = clock
        self.news: Callable[[], None] = lambda: None  # a wait began, or a lane went quiet
        self._flying: dict[str, int] = {}
        self._arrivals: dict[str, list[float]] = {}  # waiting requests' arrival, oldest first
        self._quiet: dict[str, float] = {}  # when the lane last went quiet
        self._seen: dict[str, float] = {}  # when the lane last had a request
        self._idle: dict[str, asyncio.Event] = {}

    def in_flight(self, lane: str) -> int:
        """Requests sent to the lane's engine whose answer has not ended."""
        return self._flying.get(lane, 0)

    def queued(self, lane: str) -> int:
        """Requests waiting for the lane to be ready."""
        return len(self._arrivals.get(lane, ()))

    def arrivals(self, lane: str) -> tuple[float, ...]:
        """When each request waiting for the lane arrived, oldest first."""
        return tuple(self._arrivals.get(lane, ()))

    def quiet_since(self, lane: str) -> float | None:
        """Since when nothing was in flight to the lane or waiting for it (None: something
        is; 0.0: nothing ever was)."""
        if self.in_flight(lane) or self.queued(lane):
            return None
        return self._quiet.get(lane, 0.0)

    def last_request(self, lane: str) -> float | None:
        """When a request for the lane last arrived (None: never since laned started)."""
        return self._seen.get(lane)

    def counts(self, lane: str) -> dict[str, float]:
        """Both, as the lane's view shows them, and how long the oldest waiter has waited."""
        waiting = self._arrivals.get(lane)
        oldest = round(self.clock() - waiting[0], 1) if waiting else 0.0
        return {
            "in_flight": self.in_flight(lane),
            "queued": self.queued(lane),
            "oldest_wait": oldest,
        }

    def enter(self, lane: str) -> Flight:
        """A request goes to the lane's engine now."""
        self._flying[lane] = self.in_flight(lane) + 1
        self._seen[lane] = self.clock()
        self._idle_event(lane).clear()
        return Flight(self, lane)

    def _leave(self, lane: str) -> None:
        self._flying[lane] -= 1
        if self._flying[lane] == 0:
            self._idle_event(lane).set()
            if not self.queued(lane):
                self._quiet[lane] = self.clock()
                self.news()

    def wait_begins(self, lane: str) -> float:
        """A request begins to wait for the lane: when it arrived (for `wait_ends`)."""
        self._seen[lane] = arrived = self.clock()
        self._arrivals.setdefault(lane, []).append(arrived)
        self.news()
        return arrived

    def wait_ends(self, lane: str, arrived: float) -> None:
        """A request stops waiting (the lane is ready, or it will not be)."""
        waiting = self._arrivals[lane]
        waiting.remove(arrived)
        if not waiting and not self.in_flight(lane):
            self._quiet[lane] = self.clock()

    async def drain(self, lane: str, timeout: float) -> int:
        """Wait until no request is in flight to the lane, `timeout` seconds at most; the
        number still in flight then (0: drained)."""
        if self.in_flight(lane):
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._idle_event(lane).wait(), timeout)
        return self.in_flight(lane)

    async def drain_before_stop(
        self, lane: str, drain_timeout: float, force: bool, note: Callable[[str], None]
    ) -> None:
        """Wait for the requests in flight to the lane (it is sent no new ones: it is
        stopping or restarting), up to its drain_timeout; `force` cuts them. The notes say
        which."""
        count = self.in_flight(lane)
        if not count:
            return
        if force:
            note(f"force: cutting {count} request(s) in flight, no drain")
            return
        note(f"draining {count} request(s) (drain_timeout {drain_timeout:g} s)")
        began = self.clock()
        left = await self.drain(lane, drain_timeout)
        if left:
            note(
                f"drain_timeout {drain_timeout:g} s passed: cutting {left} request(s) still in flight"
            )
        else:
            note(f"drained {count} request(s) in {self.clock() - began:.1f} s")

    def _idle_event(self, lane: str) -> asyncio.Event:
        event = self._idle.get(lane)
        if event is None:
            event = self._idle[lane] = asyncio.Event()
            if not self.in_flight(lane):
                event.set()
        return event
