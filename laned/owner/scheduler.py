"""Requests for lanes that compete for GPU memory, scheduled (docs/proxy.md, "Several
models"): a part of the owner (laned.owner.supervisor) that gathers, for each lane with
requests waiting, its snapshot and that of the lanes it would take off (laned.core.placement),
asks the pure policy (laned.core.schedule) and acts on its decision with an activation. A lane
that fits beside the running ones starts without a swap. The proxy asks it whether a request
goes now, waits, or is refused, and waits here for its turn.

It acts only where no request is under way on those lanes (an operator's request, or its
own last swap, runs to its end first), and it decides again whenever something happens: a
request begins to wait, a lane goes quiet (laned.owner.traffic), any lane event (the
book), or a residency it waits for ends.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable

from laned.config.groups import default_lanes
from laned.core import placement, schedule
from laned.core.lanes import Desired, Event, EventKind, LaneState, LaneStatus
from laned.core.schedule import Admission, Decision, LaneView, Verdict
from laned.errors import LanedError, Superseded
from laned.owner.records import Records
from laned.owner.traffic import Traffic

log = logging.getLogger("laned.supervisor")

SERVING = (LaneState.READY, LaneState.DEGRADED)
RETRY_AFTER = 60.0  # seconds before an idle return that failed is tried again
WAITING_LOOK = 5.0  # seconds between two looks at a group while requests wait in it
Activate = Callable[[str, str], "asyncio.Future[LaneStatus]"]


class Scheduler:
    """The swaps for the requests that wait, and the requests' turns."""

    def __init__(self, records: Records, traffic: Traffic, activate: Activate) -> None:
        self.records, self.traffic, self.activate = records, traffic, activate
        self._news: asyncio.Future[None] | None = None
        # Requests that arrived up to a time are answered with why (an operator's
        # deactivate, an activation preflight refused): (then, why, hint), per lane.
        self._dismissed: dict[str, tuple[float, str, str]] = {}
        self._cooling: dict[str, float] = {}  # a swap to it failed: no idle return till then
        traffic.news = self.news
        records.book.listeners.append(self._event)

    # --- news ---------------------------------------------------------------------------------

    def news(self) -> None:
        """Something happened: whoever waits looks again."""
        if self._news is not None and not self._news.done():
            self._news.set_result(None)

    def _event(self, event: Event) -> None:
        if event.kind is EventKind.TRANSITION:
            self.news()

    async def _next_news(self, timeout: float | None) -> None:
        if self._news is None or self._news.done():
            self._news = asyncio.get_running_loop().create_future()
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(asyncio.shield(self._news), timeout)

    def dismiss(self, lane: str, why: str, hint: str = "") -> None:
        """The requests waiting for the lane now are answered with `why`."""
        self._dismissed[lane] = (self.records.clock(), why, hint)
        self.news()

    # --- the proxy's side ---------------------------------------------------------------------

    def admission(self, lane: str, arrived: float) -> Admission:
        """Whether a request for `lane` that arrived at `arrived` goes to its engine now,
        waits, or is refused (with why)."""
        r = self.records
        status = r.statuses[lane]
        fifo = r.config.daemon.schedule == "fifo"
        if status.state in SERVING and not fifo:
            return Admission(Verdict.GO)  # the common case, with no snapshot to build
        dismissed = self._dismissed.get(lane)
        if dismissed is not None and arrived <= dismissed[0]:
            return Admission(Verdict.REFUSE, dismissed[1], dismissed[2])
        rivals = set(r.evictions(lane).lanes) | self._apart(lane)
        peers = [self.view(p) for p in sorted(rivals)]
        return schedule.admit(self.view(lane), peers, r.config.daemon.schedule, arrived)

    def _apart(self, lane: str) -> set[str]:
        """The lanes that never run beside `lane` (their requests compete with its own)."""
        r = self.records
        fps, me = r.footprints, r.footprints[lane]
        return {
            n
            for n, fp in fps.items()
            if n != lane and not placement.together(me, fp, r.gpu_totals)[0]
        }

    async def turn(self, lane: str, arrived: float, timeout: float) -> Admission:
        """Wait until the request that arrived at `arrived` may go (GO) or will not (REFUSE);
        TimeoutError after `timeout` seconds."""
        deadline = asyncio.get_running_loop().time() + timeout
        while True:
            verdict = self.admission(lane, arrived)
            if verdict.verdict is not Verdict.WAIT:
                return verdict
            left = deadline - asyncio.get_running_loop().time()
            if left <= 0:
                raise asyncio.TimeoutError
            await self._next_news(left)

    # --- deciding -----------------------------------------------------------------------------

    def view(self, lane: str) -> LaneView:
        """The lane as the policy sees it."""
        r = self.records
        spec, status = r.config.lanes[lane], r.statuses[lane]
        serving = status.state in SERVING
        if status.state is LaneState.FAILED:  # a crash loop is not restarted by retries
            blocked = (
                f"it failed ({status.reason}), and a request does not start a failed lane again"
            )
        elif not spec.on_demand:
            blocked = "on_demand is off for it"
        else:
            blocked = ""
        residency, _how = schedule.min_residency(
            spec.min_residency, status.woke, status.last_wake, status.last_cold_start
        )
        dismissed = self._dismissed.get(lane, (float("-inf"),))[0]
        # Its acceptance checks are requests too (they do not go through the endpoint).
        quiet = None if status.checking else self.traffic.quiet_since(lane)
        return LaneView(
            name=lane,
            serving=serving,
            resident=status.desired is Desired.ACTIVE and status.state is not LaneState.FAILED,
            blocked=blocked,
            pinned=spec.pinned,
            priority=spec.priority,
            min_residency=residency,
            ready_since=status.ready_at if serving else None,
            quiet_since=None if quiet is None else max(quiet, status.ready_at),
            in_flight=self.traffic.in_flight(lane) + status.checking,
            arrivals=tuple(t for t in self.traffic.arrivals(lane) if t > dismissed),
        )

    async def run(self) -> None:
        """Decide whenever something happens, until cancelled."""
        while True:
            again = self.decide()
            wait = None if again is None else max(again - self.records.clock(), 0.01)
            await self._next_news(wait)

    def decide(self) -> float | None:
        """The swaps due now, made; when to decide again without news.

        Each lane with requests waiting, the longest-waiting first (fifo: the oldest request
        first), is decided with the lanes it would take off (laned.core.placement): none,
        and it starts at once; else the policy says whether they have served long enough.
        A lane decided on reserves those lanes for this round, so a later one cannot take
        them first. Then each default lane's idle return, the same way."""
        r = self.records
        config, now = r.config, r.clock()
        fifo = config.daemon.schedule == "fifo"
        views = {n: self.view(n) for n in config.lanes}
        waiting = [v for v in views.values() if v.arrivals and not v.resident and not v.blocked]
        if fifo:
            waiting.sort(key=lambda v: (v.arrivals[0], v.name))
        else:
            waiting.sort(
                key=lambda v: (v.arrivals[0] - v.priority * schedule.PRIORITY_STEP, v.name)
            )
        reserved: set[str] = set()
        again: float | None = None
        for lane in waiting:
            off = r.evictions(lane.name).lanes
            lanes = {lane.name, *off}
            if reserved & lanes or r.busy(lanes):
                reserved |= lanes
                continue  # an operation runs to its end first, or an older lane comes first
            reserved |= lanes
            decision = schedule.decide(
                [lane, *(views[n] for n in off)], now, config.daemon.schedule
            )
            if decision.swap_to is not None and not off and r.placed():
                decision = Decision(
                    lane.name,
                    f"start {lane.name}: {len(lane.arrivals)} request(s) waiting "
                    f"{now - lane.arrivals[0]:.0f} s; it fits beside the lanes running",
                    "fits",
                )
            if decision.swap_to is not None:
                self._swap(decision)
            else:
                later = min(decision.again_at or now + WAITING_LOOK, now + WAITING_LOOK)
                again = later if again is None else min(again, later)
        for default, idle in default_lanes(config):
            back = self._idle_return(default, idle, views, reserved)
            if back is not None:
                again = back if again is None else min(again, back)
        return again

    def _idle_return(
        self, default: str, idle: float | None, views: dict[str, LaneView], reserved: set[str]
    ) -> float | None:
        """Back to a default lane after its idle return, from the lanes it would take off."""
        r = self.records
        if idle is None or views[default].resident:
            return None
        off = r.evictions(default).lanes
        lanes = {default, *off}
        if not off or reserved & lanes or r.busy(lanes):
            return None
        reserved |= lanes
        last = [t for n in lanes if (t := self.traffic.last_request(n)) is not None]
        decision = schedule.decide(
            [views[default], *(views[n] for n in off)],
            r.clock(),
            r.config.daemon.schedule,
            default,
            idle,
            max(last, default=None),
        )
        if decision.swap_to is None:
            return decision.again_at
        cooling = self._cooling.get(default, 0.0)
        if r.clock() < cooling:
            return cooling  # its last return failed: not again at every event
        self._swap(decision)
        return None

    def _swap(self, decision: Decision) -> None:
        """Act on a decision: the activation, noted and counted."""
        r, lane = self.records, decision.swap_to
        assert lane is not None
        r.book.note(lane, EventKind.SCHEDULE, decision.reason)
        r.recorder.schedule_swap(lane, decision.cause)
        activation = self.activate(lane, decision.reason)
        activation.add_done_callback(lambda done: self._activated(lane, done))

    def _activated(self, lane: str, done: asyncio.Future[LaneStatus]) -> None:
        """A swap this part asked for ended: one preflight refused (nothing was stopped)
        answers the requests that waited for it, or the next news would ask again."""
        if done.cancelled():
            return
        exc = done.exception()
        failed = self.records.statuses[lane].state is LaneState.FAILED  # refuses by itself
        if isinstance(exc, LanedError) and not isinstance(exc, Superseded):
            self._cooling[lane] = self.records.clock() + RETRY_AFTER
            if not failed:
                self.dismiss(lane, f"cannot be activated on demand: {exc.message}", exc.hint)
        self.news()
