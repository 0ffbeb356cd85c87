"""The owner's book: every lane's record, the event log, the day's timeline, the listeners.

A record is replaced here by the lane machine's runner alone (laned.owner.interpreter:
`replace`); everyone else reads it (the records are immutable: a reader holds a snapshot).
Every transition and note is an event that the listeners hear and the state file keeps.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from types import MappingProxyType
from typing import Any

from laned.core import inputs as i
from laned.core.lanes import Desired, Event, EventKind, LaneState, LaneStatus
from laned.core.saved import EVENTS_KEPT, HISTORY_KEPT, HISTORY_SECONDS, Saved

log = logging.getLogger("laned.supervisor")

Listener = Callable[[Event], None]


def _quiet(future: asyncio.Future[Any]) -> None:
    """Mark a future's exception as retrieved: nobody may be waiting for it."""
    future.add_done_callback(lambda f: f.exception() if not f.cancelled() else None)


def new_future() -> asyncio.Future[LaneStatus]:
    """A future for a lane's outcome whose unobserved failure is not logged as lost."""
    future: asyncio.Future[LaneStatus] = asyncio.get_running_loop().create_future()
    _quiet(future)
    return future


def _kept(status: LaneStatus) -> tuple[object, ...]:
    """What state.json keeps of a lane (Book.saved)."""
    failed = status.reason if status.state is LaneState.FAILED else None
    return (
        status.desired,
        status.restarts,
        status.last_exit,
        status.last_cold_start,
        status.last_starts,
        status.last_phases,
        status.image_id,
        failed,
    )


class Book:
    """The configured lanes' records and events."""

    def __init__(
        self,
        lanes: Iterable[str],
        clock: Callable[[], float],
        changed: Callable[[], None] = lambda: None,
    ) -> None:
        self.clock = clock
        self.changed = changed  # something worth saving changed (the state file's writer)
        self._statuses: dict[str, LaneStatus] = {n: LaneStatus(n) for n in lanes}
        self.statuses: Mapping[str, LaneStatus] = MappingProxyType(self._statuses)
        self.events: deque[Event] = deque(maxlen=EVENTS_KEPT)
        self.history: deque[tuple[float, str, str, str]] = deque(maxlen=HISTORY_KEPT)
        self.listeners: list[Listener] = []

    # --- reading ----------------------------------------------------------------------------

    def __getitem__(self, lane: str) -> LaneStatus:
        return self._statuses[lane]

    def timeline(self, since: float) -> list[dict[str, Any]]:
        """The transitions since `since` (kept for a day, across laned's restarts)."""
        return [
            {"at": at, "lane": lane, "from": was, "to": to}
            for at, lane, was, to in self.history
            if at >= since
        ]

    def states(self) -> dict[str, LaneState]:
        """Every lane's state."""
        return {n: s.state for n, s in self._statuses.items()}

    def saved(self) -> Saved:
        """What state.json keeps (taken on the loop, written in a thread)."""
        statuses = self._statuses.values()
        return Saved(
            desired={s.name: s.desired for s in statuses},
            restarts={s.name: s.restarts for s in statuses},
            last_exit={s.name: s.last_exit for s in statuses if s.last_exit},
            last_cold_start={s.name: s.last_cold_start for s in statuses if s.last_cold_start},
            last_starts={s.name: dict(s.last_starts) for s in statuses if s.last_starts},
            last_phases={s.name: dict(s.last_phases) for s in statuses if s.last_phases},
            image_ids={s.name: s.image_id for s in statuses if s.image_id},
            failed={s.name: s.reason for s in statuses if s.state is LaneState.FAILED},
            events=list(self.events),
            history=list(self.history),
        )

    @staticmethod
    def restoring(saved: Saved, lane: str, checks: dict[str, Any] | None) -> i.Restore:
        """The input that takes up what state.json kept of `lane` (the reverse of `saved`)."""
        return i.Restore(
            desired=saved.desired.get(lane, Desired.INACTIVE),
            restarts=saved.restarts.get(lane, 0),
            last_exit=saved.last_exit.get(lane),
            last_cold_start=saved.last_cold_start.get(lane),
            last_starts=dict(saved.last_starts.get(lane, {})),
            last_phases=dict(saved.last_phases.get(lane, {})),
            image_id=saved.image_ids.get(lane),
            checks=checks,
            failed=saved.failed.get(lane),
        )

    def restore_log(self, saved: Saved) -> None:
        """The events and the day's timeline state.json kept."""
        now = self.clock()
        self.events.extend(e for e in saved.events if e.lane in self._statuses)
        self.history.extend(h for h in saved.history if h[0] >= now - HISTORY_SECONDS)

    # --- changing (the interpreter only) ------------------------------------------------------

    def replace(self, lane: str, record: LaneStatus) -> None:
        """The lane's new record, as the lane machine's step made it (state.json is written
        again only when what it keeps of the lane changed)."""
        was = self._statuses.get(lane)
        self._statuses[lane] = record
        if was is None or _kept(was) != _kept(record):
            self.changed()

    def add(self, lane: str) -> None:
        """A lane new in a reloaded config."""
        self._statuses.setdefault(lane, LaneStatus(lane, since=self.clock()))

    def drop(self, lane: str) -> None:
        """A lane gone from a reloaded config (it does not run: reload refuses otherwise)."""
        self._statuses.pop(lane, None)

    def publish(self, event: Event) -> None:
        """A transition: logged, kept, heard."""
        log.info(
            "%s: %s -> %s (%s)",
            event.lane,
            event.from_state.value,
            event.to_state.value,
            event.reason,
        )
        self.history.append((event.at, event.lane, event.from_state.value, event.to_state.value))
        while self.history and self.history[0][0] < event.at - HISTORY_SECONDS:
            self.history.popleft()
        self._heard(event)

    def note(self, lane: str, kind: EventKind, text: str) -> None:
        """An event that changes no state (preflight, gate, prepare output, checks)."""
        record = self._statuses.get(lane)
        now = record.state if record is not None else LaneState.INACTIVE
        log.info("%s: %s: %s", lane, kind.value, text)
        self._heard(Event(self.clock(), lane, now, now, text, kind))

    def _heard(self, event: Event) -> None:
        self.events.append(event)
        self.changed()
        for listener in list(self.listeners):
            listener(event)
