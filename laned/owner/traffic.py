"""Requests at laned's OpenAI endpoint, per lane: in flight to its engine, and waiting for it.

The proxy (`laned.api.proxy`) counts; the owner (`laned.owner.supervisor`) drains a lane before it
stops it: it refuses new requests (the lane is `stopping`) and waits here until the
requests in flight have ended, up to the lane's `drain_timeout`. Requests sent to an
engine's port directly are not counted: laned does not see them.
"""

from __future__ import annotations

import asyncio
import contextlib


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

    def __init__(self) -> None:
        self._flying: dict[str, int] = {}
        self._queued: dict[str, int] = {}
        self._idle: dict[str, asyncio.Event] = {}

    def in_flight(self, lane: str) -> int:
        """Requests sent to the lane's engine whose answer has not ended."""
        return self._flying.get(lane, 0)

    def queued(self, lane: str) -> int:
        """Requests waiting for the lane to be ready."""
        return self._queued.get(lane, 0)

    def counts(self, lane: str) -> dict[str, int]:
        """Both, as the lane's view shows them."""
        return {"in_flight": self.in_flight(lane), "queued": self.queued(lane)}

    def enter(self, lane: str) -> Flight:
        """A request goes to the lane's engine now."""
        self._flying[lane] = self.in_flight(lane) + 1
        self._idle_event(lane).clear()
        return Flight(self, lane)

    def _leave(self, lane: str) -> None:
        self._flying[lane] -= 1
        if self._flying[lane] == 0:
            self._idle_event(lane).set()

    def wait_begins(self, lane: str) -> None:
        """A request begins to wait for the lane."""
        self._queued[lane] = self.queued(lane) + 1

    def wait_ends(self, lane: str) -> None:
        """A request stops waiting (the lane is ready, or it will not be)."""
        self._queued[lane] -= 1

    async def drain(self, lane: str, timeout: float) -> int:
        """Wait until no request is in flight to the lane, `timeout` seconds at most; the
        number still in flight then (0: drained)."""
        if self.in_flight(lane):
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._idle_event(lane).wait(), timeout)
        return self.in_flight(lane)

    def _idle_event(self, lane: str) -> asyncio.Event:
        event = self._idle.get(lane)
        if event is None:
            event = self._idle[lane] = asyncio.Event()
            if not self.in_flight(lane):
                event.set()
        return event
