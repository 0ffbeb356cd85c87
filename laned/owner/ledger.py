"""The lane book: every lane's status, the event log, listeners and readiness waiters.

It holds state and says what changed; it decides nothing. The supervisor (the one owner) is
the only code that calls its mutating methods; the front, the API and the metrics read it.
Every change goes through `transition` (a state change) or `note` (an event that changes no
state), so every change is an event that listeners see and the state file keeps.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Callable, Iterable
from typing import Any

from laned.adapters import state
from laned.core.lanes import Desired, Event, EventKind, LaneState, LaneStatus
from laned.errors import ActivationFailed, Superseded

log = logging.getLogger("laned.supervisor")

Listener = Callable[[Event], None]


def _quiet(future: asyncio.Future[LaneStatus]) -> None:
    """Mark a future's exception as retrieved: nobody may be waiting for it."""
    future.add_done_callback(lambda f: f.exception() if not f.cancelled() else None)


def new_future() -> asyncio.Future[LaneStatus]:
    """A future for a lane's outcome whose unobserved failure is not logged as lost."""
    future: asyncio.Future[LaneStatus] = asyncio.get_running_loop().create_future()
    _quiet(future)
    return future


class Ledger:
    """Statuses and events of the configured lanes."""

    def __init__(
        self,
        lanes: Iterable[str],
        clock: Callable[[], float],
        changed: Callable[[], None] = lambda: None,
    ) -> None:
        self.clock = clock
        self.changed = changed  # something worth saving changed (see state.StateWriter)
        self.statuses: dict[str, LaneStatus] = {n: LaneStatus(n) for n in lanes}
        self.events: deque[Event] = deque(maxlen=state.EVENTS_KEPT)
        self.history: deque[tuple[float, str, str, str]] = deque(maxlen=state.HISTORY_KEPT)
        self.listeners: list[Listener] = []
        self._waiters: dict[str, list[asyncio.Future[LaneStatus]]] = {}

    # --- reading ----------------------------------------------------------------------------

    def __getitem__(self, lane: str) -> LaneStatus:
        return self.statuses[lane]

    def timeline(self, since: float) -> list[dict[str, Any]]:
        """The transitions since `since` (kept for a day, across laned's restarts)."""
        return [
            {"at": at, "lane": lane, "from": was, "to": to}
            for at, lane, was, to in self.history
            if at >= since
        ]

    def states(self) -> dict[str, LaneState]:
        """Every lane's state."""
        return {n: s.state for n, s in self.statuses.items()}

    def saved(self) -> state.Saved:
        """What state.json keeps, as copies (taken on the loop, written in a thread)."""
        statuses = self.statuses.values()
        return state.Saved(
            desired={s.name: s.desired for s in statuses},
            restarts={s.name: s.restarts for s in statuses},
            last_exit={s.name: s.last_exit for s in statuses if s.last_exit},
            last_cold_start={s.name: s.last_cold_start for s in statuses if s.last_cold_start},
            last_phases={s.name: dict(s.last_phases) for s in statuses if s.last_phases},
            image_ids={s.name: s.image_id for s in statuses if s.image_id},
            failed={s.name: s.reason for s in statuses if s.state is LaneState.FAILED},
            events=list(self.events),
            history=list(self.history),
        )

    def restore(self, saved: state.Saved, checks: Callable[[str], dict[str, Any] | None]) -> None:
        """Take up what state.json kept (the reverse of `saved`), each lane's last acceptance
        run from `checks`. A lane that gave up (crash loop, start timeout) stays failed until
        activated."""
        now = self.clock()
        for name, status in self.statuses.items():
            status.desired = saved.desired.get(name, Desired.INACTIVE)
            status.restarts = saved.restarts.get(name, 0)
            status.last_exit = saved.last_exit.get(name)
            status.last_cold_start = saved.last_cold_start.get(name)
            status.last_phases = saved.last_phases.get(name, {})
            status.image_id = saved.image_ids.get(name)
            status.checks, status.since = checks(name), now
            if name in saved.failed:
                status.state, status.reason = LaneState.FAILED, saved.failed[name]
        self.events.extend(e for e in saved.events if e.lane in self.statuses)
        self.history.extend(h for h in saved.history if h[0] >= now - state.HISTORY_SECONDS)

    # --- changing (the owner only) -------------------------------------------------------------

    def transition(self, lane: str, to: LaneState, reason: str) -> None:
        """The only place a lane's state changes: record the event, save, notify."""
        status = self.statuses[lane]
        event = Event(self.clock(), lane, status.state, to, reason)
        status.state, status.since, status.reason = to, event.at, reason
        if to is not LaneState.STARTING:
            status.phase, status.progress = None, None
        log.info("%s: %s -> %s (%s)", lane, event.from_state.value, to.value, reason)
        self.history.append((event.at, lane, event.from_state.value, to.value))
        while self.history and self.history[0][0] < event.at - state.HISTORY_SECONDS:
            self.history.popleft()
        self._publish(event)
        if to is LaneState.READY:
            for waiter in self._waiters.pop(lane, []):
                if not waiter.done():
                    waiter.set_result(status)

    def note(self, lane: str, kind: EventKind, text: str) -> None:
        """An event that changes no state (preflight, gate, prepare output, checks)."""
        now = self.statuses[lane].state
        log.info("%s: %s: %s", lane, kind.value, text)
        self._publish(Event(self.clock(), lane, now, now, text, kind))

    def _publish(self, event: Event) -> None:
        self.events.append(event)
        self.changed()
        for listener in list(self.listeners):
            listener(event)

    def desire(self, lane: str, desired: Desired) -> None:
        """Record what the operator asked for."""
        self.statuses[lane].desired = desired
        self.changed()

    def add(self, lane: str) -> None:
        """A lane new in a reloaded config."""
        self.statuses.setdefault(lane, LaneStatus(lane, since=self.clock()))

    def drop(self, lane: str) -> None:
        """A lane gone from a reloaded config (it does not run: reload refuses otherwise)."""
        self.statuses.pop(lane, None)
        self.fail_waiters(lane, "removed from the config")

    # --- waiting for readiness ------------------------------------------------------------------

    def wait_ready(self, lane: str) -> asyncio.Future[LaneStatus]:
        """A future that resolves when the lane is ready (at once if it is)."""
        future = new_future()
        if self.statuses[lane].state is LaneState.READY:
            future.set_result(self.statuses[lane])
        else:
            self._waiters.setdefault(lane, []).append(future)
        return future

    def fail_waiters(self, lane: str, reason: str, superseded: bool = False) -> None:
        """Everyone waiting for the lane hears why it will not become ready."""
        for waiter in self._waiters.pop(lane, []):
            if waiter.done():
                continue
            if superseded:
                waiter.set_exception(
                    Superseded(f"lane {lane}: {reason}", "the newest request for a group wins")
                )
            else:
                waiter.set_exception(
                    ActivationFailed(f"lane {lane}: {reason}", f"see `laned logs {lane}`")
                )
