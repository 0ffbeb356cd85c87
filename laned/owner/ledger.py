"""The lane machine's runner: every lane's record (its LaneStatus, its current run included),
the event log, listeners and readiness waiters.

A lane's state moves in one place, `fire`: it looks the (mode, event) pair up in the lane
machine's table (laned.core.machine) and applies the outcome — the record's own changes here,
what the owner does about the run through its `Hands` (laned.owner.records.Records). The other
methods record what a run showed (an exit, a readiness, a phase, a sleep, a failure counted);
no other module assigns to a record. It decides nothing: the owner's parts judge (with
laned.core.policy) and fire; the front, the API and the metrics read. Every change is an
event (a transition, or a `note` that changes no state) that listeners see and the state file
keeps.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Callable, Iterable
from typing import Any, Protocol

from laned.config.model import LaneConfig
from laned.core.lanes import (
    START_COLD,
    START_SLEEP,
    Desired,
    Event,
    EventKind,
    LaneState,
    LaneStatus,
    LastExit,
    Mode,
    phase_durations,
)
from laned.core.liveness import EngineSample
from laned.core.machine import Effect, Ev, Outcome, decide
from laned.core.phases import ALMOST_READY, Seen, add_mark
from laned.core.policy import HOLDING_STATES
from laned.core.saved import EVENTS_KEPT, HISTORY_KEPT, HISTORY_SECONDS, Saved
from laned.errors import ActivationFailed, Superseded

log = logging.getLogger("laned.supervisor")

Listener = Callable[[Event], None]
SAMPLES_KEPT = 60.0  # seconds of an engine's /metrics samples (its tokens/s over a minute)
JOURNAL_LAG = 30.0  # seconds journald may stamp a start's log line after the engine answered


class Hands(Protocol):
    """What the owner does about a run when the machine says so (laned.owner.records)."""

    def follow(self, lane: str) -> None:
        """Watch the lane's current run: readiness, then liveness."""

    def unfollow(self, lane: str) -> None:
        """Stop watching it."""

    def cancel_restart(self, lane: str) -> None:
        """Drop a restart waiting for its backoff."""

    def schedule_restart(self, lane: str, delay: float) -> None:
        """Start the lane again after `delay` seconds."""


class NoHands:
    """A ledger on its own (benchmarks, tests of the book alone): the run is not acted on."""

    def follow(self, lane: str) -> None:
        pass

    def unfollow(self, lane: str) -> None:
        pass

    def cancel_restart(self, lane: str) -> None:
        pass

    def schedule_restart(self, lane: str, delay: float) -> None:
        pass


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
        hands: Hands | None = None,
    ) -> None:
        self.clock = clock
        self.hands: Hands = hands or NoHands()
        self.changed = changed  # something worth saving changed (the state file's writer)
        self.statuses: dict[str, LaneStatus] = {n: LaneStatus(n) for n in lanes}
        self.events: deque[Event] = deque(maxlen=EVENTS_KEPT)
        self.history: deque[tuple[float, str, str, str]] = deque(maxlen=HISTORY_KEPT)
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

    def saved(self) -> Saved:
        """What state.json keeps, as copies (taken on the loop, written in a thread)."""
        statuses = self.statuses.values()
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

    def restore(self, saved: Saved, checks: Callable[[str], dict[str, Any] | None]) -> None:
        """Take up what state.json kept (the reverse of `saved`), each lane's last acceptance
        run from `checks`. A lane that gave up (crash loop, start timeout) stays failed until
        activated."""
        now = self.clock()
        for name, status in self.statuses.items():
            status.desired = saved.desired.get(name, Desired.INACTIVE)
            status.restarts = saved.restarts.get(name, 0)
            status.last_exit = saved.last_exit.get(name)
            status.last_cold_start = saved.last_cold_start.get(name)
            status.last_starts = dict(saved.last_starts.get(name, {}))
            status.last_phases = saved.last_phases.get(name, {})
            status.image_id = saved.image_ids.get(name)
            status.checks, status.since = checks(name), now
            if name in saved.failed:
                status.mode, status.state = Mode.FAILED, LaneState.FAILED
                status.reason = saved.failed[name]
        self.events.extend(e for e in saved.events if e.lane in self.statuses)
        self.history.extend(h for h in saved.history if h[0] >= now - HISTORY_SECONDS)

    # --- changing (the owner only) -------------------------------------------------------------

    def fire(
        self,
        lane: str,
        event: Ev,
        reason: str,
        spec: LaneConfig | None = None,
        delay: float = 0.0,
    ) -> bool:
        """The one place a lane's state moves: `event` looked up for the lane's mode in the
        machine's table, the outcome applied (`spec`: the config a new run starts with;
        `delay`: of a restart it schedules). False: the table ignores it there (logged)."""
        status = self.statuses[lane]
        outcome = decide(status.mode, event)
        if outcome.ignored:
            log.debug(
                "%s: %s ignored in %s: %s", lane, event.value, status.mode.value, outcome.ignored
            )
            return False
        self._apply(status, outcome, reason, spec, delay)
        return True

    def _apply(
        self,
        status: LaneStatus,
        outcome: Outcome,
        reason: str,
        spec: LaneConfig | None,
        delay: float,
    ) -> None:
        lane, effects = status.name, outcome.effects
        if Effect.NEW_RUN in effects:
            status.run += 1
            status.spec = spec
            status.started_at = self.clock()
            status.phases, status.notes, status.weights_at_start = [], [], None
            status.start_kind = ""  # said by the one who starts it (the weight cache's part)
            # No stop of laned's is under way for a run that just began: a stop flagged for
            # the one before by an operation superseded before it ran must not make this
            # run's own death look asked for (a dead lane left `ready`).
            status.stopping = False
        if Effect.NEW_ENGINE in effects:
            status.pinned = False
        if Effect.STOP_BEGINS in effects:
            status.stopping = True
        if outcome.to is not None:
            self._move(status, outcome.to, reason)
        for effect in effects:
            if effect is Effect.CANCEL_RESTART:
                self.hands.cancel_restart(lane)
            elif effect is Effect.SCHEDULE_RESTART:
                self.hands.schedule_restart(lane, delay)
            elif effect is Effect.UNFOLLOW:
                self.hands.unfollow(lane)
            elif effect is Effect.FOLLOW:
                self.hands.follow(lane)
            elif effect is Effect.RESOLVE_WAITERS:
                for waiter in self._waiters.pop(lane, []):
                    if not waiter.done():
                        waiter.set_result(status)
            elif effect is Effect.FAIL_WAITERS:
                self.fail_waiters(lane, reason)
            elif effect is Effect.SUPERSEDE_WAITERS:
                self.fail_waiters(lane, reason, superseded=True)

    def _move(self, status: LaneStatus, to: Mode, reason: str) -> None:
        lane, shown = status.name, to.visible
        event = Event(self.clock(), lane, status.state, shown, reason)
        status.mode, status.state, status.since, status.reason = to, shown, event.at, reason
        if shown is not LaneState.STARTING:
            status.phase, status.progress = None, None
        log.info("%s: %s -> %s (%s)", lane, event.from_state.value, shown.value, reason)
        self.history.append((event.at, lane, event.from_state.value, shown.value))
        while self.history and self.history[0][0] < event.at - HISTORY_SECONDS:
            self.history.popleft()
        self._publish(event)

    # --- what a run showed (recorded here, judged by the owner's parts) ------------------------

    def stop_over(self, lane: str) -> None:
        """laned's own stop of the lane is over (confirmed, refused or superseded)."""
        self.statuses[lane].stopping = False

    def failure_counted(self, lane: str, failures: Iterable[float], what: str) -> None:
        """The current run's failure, counted once (`what` saw it first); the window after it."""
        status = self.statuses[lane]
        status.failures[:] = failures
        status.failed = (status.run, what)
        self.changed()

    def failures_cleared(self, lane: str) -> None:
        """An operator's activate: the crash-loop window begins again."""
        self.statuses[lane].failures.clear()

    def exited(
        self,
        lane: str,
        last_exit: LastExit,
        failures: Iterable[float] | None,
        counted: bool,
    ) -> None:
        """The run's exit as judged; the failure window after it (None: unchanged);
        `counted`: the exit is the run's failure, seen first."""
        status = self.statuses[lane]
        status.last_exit = last_exit
        if failures is not None:
            status.failures[:] = failures
        if counted:
            status.failed = (status.run, "its exit")
        self.changed()

    def restarted(self, lane: str, at_least: int = 0) -> int:
        """One more restart of the lane (at least `at_least`: systemd's own count); the count."""
        status = self.statuses[lane]
        status.restarts = max(status.restarts + 1, at_least)
        self.changed()
        return status.restarts

    def ready(self, lane: str, reason: str, image_id: str | None) -> float | None:
        """The run answers: READY fired, and what its start took kept (a wake's apart from a
        cold start's, the phases, the image of a good start). The seconds it took; None when
        the machine ignores it (not starting: an earlier run's report)."""
        status = self.statuses[lane]
        if decide(status.mode, Ev.READY).ignored:
            return None
        now = self.clock()
        took = round(now - (now if status.started_at is None else status.started_at), 3)
        status.woke = status.mode is Mode.WAKING  # what this run's swap-in cost
        kind = START_SLEEP if status.woke else (status.start_kind or START_COLD)
        status.start_kind = kind
        status.last_starts[kind] = took  # each kind predicts its own next start
        if status.woke:  # a wake from sleep: its own figure, not the cold start's prediction
            status.last_wake = took
        elif kind == START_COLD:  # a restart from the weight cache is no cold start
            status.last_cold_start = took
        if status.phases:
            status.last_phases = dict(phase_durations(status.phases, now))
        if image_id:
            status.image_id = image_id  # of a good start: a different one later is drift
        # The failures stay: an engine that dies after each good start is a crash loop too;
        # they leave the window after start_limit_interval (or at the next activate). The
        # backoff starts again from here.
        status.ready_at = now
        self.fire(lane, Ev.READY, reason)
        return took

    def start_kind(self, lane: str, kind: str) -> None:
        """What the current start is (cold, weight-cache): expected at its start, corrected
        by what the engine's log says (a weight cache missed reads from disk)."""
        self.statuses[lane].start_kind = kind
        self.changed()

    def weights_seen(self, lane: str, state: str | None, held: int | None = None) -> None:
        """The lane's weight-cache daemon, as its unit shows it now, and the GPU memory its
        ranks said they hold (kept while it is ready)."""
        status = self.statuses[lane]
        held = held if held is not None or state != "ready" else status.weights_held
        if status.weights != state or status.weights_held != held:
            status.weights, status.weights_held = state, held
            self.changed()

    def phase_seen(self, lane: str, seen: Seen, at: float) -> bool:
        """A startup phase or note from the engine's log line, logged at `at`, kept for the
        run it belongs to. True: the phase says the engine is about to answer (probe now)."""
        status = self.statuses[lane]
        if at < (status.started_at or 0):
            return False  # an earlier run's
        holding = status.state in HOLDING_STATES
        # journald can hand a line over after the engine already answered (a container's
        # output arrives in bursts): what it said of this start is still this start's.
        if seen.note and seen.note not in status.notes and holding:
            status.notes.append(seen.note)
            self.note(lane, EventKind.STARTUP, seen.note)
        if seen.phase is None or not holding:
            return False
        # A bar reaches the journal when it closes: it began its elapsed time before.
        since = max(at - (seen.elapsed or 0.0), status.started_at or 0)
        if status.state is LaneState.STARTING:
            status.phase, status.progress = seen.phase, seen.progress
            status.phases = add_mark(status.phases, seen.phase, since)
            return seen.phase in ALMOST_READY
        # Late, but of this start: its timeline gets it. journald stamps a stream's line when
        # it reads it, and a busy host reads a burst late: a line stamped up to JOURNAL_LAG
        # after the engine answered was written before (an engine that starts in a second
        # can answer before journald reads any of its start).
        ready_at = status.ready_at
        this_run = status.started_at is not None and ready_at >= status.started_at
        if this_run and since < ready_at + JOURNAL_LAG:
            status.phases = add_mark(status.phases, seen.phase, min(since, ready_at))
            status.last_phases = dict(phase_durations(status.phases, ready_at))
        return False

    def sampled(self, lane: str, at: float, sample: EngineSample) -> None:
        """An engine's /metrics sample, kept for a minute."""
        window = self.statuses[lane].samples
        window.append((at, sample))
        while window and window[0][0] < at - SAMPLES_KEPT:
            window.popleft()

    def slept(
        self,
        lane: str,
        reason: str,
        pids: frozenset[int],
        digest: str,
        level: int,
        residual: dict[int, int],
    ) -> None:
        """The engine sleeps (SLEPT fired): its processes, the digest of what it runs, the
        level, what it kept on its GPUs (empty: not measured, the last figure stays)."""
        status = self.statuses[lane]
        status.pinned = status.pinned or level == 1  # torch keeps those until the engine ends
        status.sleepers, status.slept_as, status.slept_level = pids, digest, level
        if residual:  # what the next swap's preflight counts before it puts it to sleep
            status.residual = dict(residual)
        self.fire(lane, Ev.SLEPT, reason)

    def found_asleep(self, lane: str, digest: str, level: int, pids: frozenset[int]) -> None:
        """laned started and found the lane's engine asleep: it stays asleep, not desired."""
        status = self.statuses[lane]
        status.slept_as, status.slept_level, status.sleepers = digest, level, pids
        self.fire(lane, Ev.FOUND_ASLEEP, "found asleep")

    def checking(self, lane: str, delta: int) -> None:
        """Acceptance checks begin (+1) or end (-1) against the lane: they keep it busy."""
        self.statuses[lane].checking += delta

    def checked(self, lane: str, results: dict[str, Any]) -> None:
        """The lane's last acceptance run (laned.gates.acceptance), as kept."""
        self.statuses[lane].checks = results

    def weights_at_start(self, lane: str, run: int, shown: dict[str, Any] | None) -> bool:
        """How much of the lane's weights was resident as run `run` began; False: a newer
        run owns the lane."""
        status = self.statuses[lane]
        if status.run != run:
            return False
        status.weights_at_start = shown
        return True

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
