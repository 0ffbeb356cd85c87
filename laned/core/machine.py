"""The lane machine: every state a lane can be in, every event that can reach it, and for each
(state, event) pair what follows — the next state and the effects to run, or that the event is
ignored there and why. Pure data; `laned.owner.ledger.Ledger.fire` is the one place that looks
an outcome up and applies it, and no other code moves a lane's state.

A `Mode` is finer than the `LaneState` a user sees: what flags used to encode (a wake under
way, a lane degraded by a check but still serving, a stop that puts an engine to sleep) is a
mode of its own, and each mode shows as one LaneState (`Mode.visible`).

Effects name what the runner does with the move, in this order: the record's own changes
(a new run, waiters answered), then what the owner does about the run (watch it, stop
watching it, drop or schedule a restart). The host's work (a unit started or stopped, an
engine put to sleep, the requests drained) is the operations' (laned.owner.requests), which
fire an event when it begins and when it is confirmed.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum


class LaneState(str, Enum):
    """Where a lane is, as users see it. `degraded`: running but unhealthy or stalled;
    `failed`: given up; `sleeping`: its engine runs, off the GPUs (vLLM's sleep mode), until
    a wake or a stop."""

    INACTIVE = "inactive"
    STARTING = "starting"
    READY = "ready"
    DEGRADED = "degraded"
    RESTARTING = "restarting"
    STOPPING = "stopping"
    FAILED = "failed"
    SLEEPING = "sleeping"


class Mode(str, Enum):
    """Where a lane is, as the machine knows it (each shows as one LaneState)."""

    INACTIVE = "inactive"
    STARTING = "starting"  # a cold start: the unit started, the engine not ready yet
    WAKING = "waking"  # a start from sleep: woken, not ready yet
    READY = "ready"
    FAILING = "failing"  # failed probes or a stall: a restart or giving up follows
    DEGRADED_CHECK = "degraded-check"  # an acceptance check failed; it still serves
    DEGRADED_PEER = "degraded-peer"  # a peer rank is out of reach; it still serves
    RESTARTING = "restarting"
    STOPPING = "stopping"  # a stop laned asked for
    FALLING_ASLEEP = "falling-asleep"  # being put to sleep for a swap
    SLEEPING = "sleeping"
    FAILED = "failed"

    @property
    def visible(self) -> LaneState:
        """The state shown to users (the API, the state file, the events)."""
        return _VISIBLE[self]


_VISIBLE = {
    Mode.INACTIVE: LaneState.INACTIVE,
    Mode.STARTING: LaneState.STARTING,
    Mode.WAKING: LaneState.STARTING,
    Mode.READY: LaneState.READY,
    Mode.FAILING: LaneState.DEGRADED,
    Mode.DEGRADED_CHECK: LaneState.DEGRADED,
    Mode.DEGRADED_PEER: LaneState.DEGRADED,
    Mode.RESTARTING: LaneState.RESTARTING,
    Mode.STOPPING: LaneState.STOPPING,
    Mode.FALLING_ASLEEP: LaneState.STOPPING,
    Mode.SLEEPING: LaneState.SLEEPING,
    Mode.FAILED: LaneState.FAILED,
}

SERVING_MODES = frozenset({Mode.READY, Mode.DEGRADED_CHECK, Mode.DEGRADED_PEER})


class Ev(str, Enum):
    """Everything that can move a lane."""

    # Starts: each begins a new run.
    START = "start"  # the start gate passed, the unit's start job follows
    ADOPT = "adopt"  # found running: at laned's start, or after the user manager was away
    STARTED_OUTSIDE = "started-outside"  # an operator started its unit
    WAKE = "wake"  # a sleeper is woken for an activation
    WOKE = "woke"  # the wake and its canary are confirmed: readiness is watched as after a start
    READY = "ready"  # health answers and the model is listed
    # What the watchers and the checks see.
    UNHEALTHY = "unhealthy"  # failed health probes or a stall: a failure of this run
    CHECK_FAILED = "check-failed"
    CHECK_PASSED = "check-passed"
    PEER_LOST = "peer-lost"
    PEER_BACK = "peer-back"
    # An exit, as laned.core.policy.plan_exit judged it.
    SYSTEMD_RESTARTS = "systemd-restarts"  # Restart= of the unit brings it back itself
    RESTART_LATER = "restart-later"  # a failure: started again after the backoff
    EXIT_FAILED = "exit-failed"  # a failure not to restart (not desired)
    CRASH_LOOP = "crash-loop"  # too many failures in the window: given up
    STOPPED_WITH_MANAGER = "stopped-with-manager"  # logout, reboot: back with laned
    STOPPED_OUTSIDE = "stopped-outside"  # an operator stopped its unit
    # Laned's own stops, restarts and sleeps.
    RESTART = "restart"  # asked (an operator, failed probes, a stall): stop, then start
    STOP_ASKED = "stop-asked"  # a stop or a sleep begins: nothing more is awaited of this run
    STOP = "stop"  # the unit's stop job is asked for
    STOPPED = "stopped"  # the stop is confirmed (the unit and its container gone)
    ALREADY_STOPPED = "already-stopped"  # nothing was running to stop
    STOP_FAILED = "stop-failed"  # the container outlived its unit
    SLEEP = "sleep"  # its engine is put to sleep for a swap
    SLEPT = "slept"  # the sleep is confirmed
    FOUND_ASLEEP = "found-asleep"  # laned started and found its engine asleep
    START_REFUSED = "start-refused"  # the start gate or preflight refused (nobody else says so)
    GIVE_UP = "give-up"  # a start timeout or the memory guard: the run is stopped ...
    GAVE_UP = "gave-up"  # ... and the lane left failed until the next activate
    FOUND_STOPPED = "found-stopped"  # after an outage: its unit is not running


class Effect(str, Enum):
    """What the runner does with a move (in the order the outcome lists them)."""

    NEW_RUN = "new-run"  # the run's number, config, clock, phases and notes begin again; no stop under way
    NEW_ENGINE = "new-engine"  # a new engine process: no host buffers pinned by it yet
    STOP_BEGINS = "stop-begins"  # an exit from now on is laned's own stop, until it is over
    CANCEL_RESTART = "cancel-restart"  # a restart waiting for its backoff is dropped
    SCHEDULE_RESTART = "schedule-restart"  # started again after the event's delay
    UNFOLLOW = "unfollow"  # the run's watcher ends
    FOLLOW = "follow"  # the run is watched: readiness, then liveness
    RESOLVE_WAITERS = "resolve-waiters"  # those waiting for it to be ready hear it is
    FAIL_WAITERS = "fail-waiters"  # those waiting hear why it will not be ready
    SUPERSEDE_WAITERS = "supersede-waiters"  # those waiting hear that a newer request won


@dataclass(frozen=True)
class Outcome:
    """What an event does in a mode: `to` (None: the mode stays) and the effects; or
    `ignored`, with the reason."""

    to: Mode | None = None
    effects: tuple[Effect, ...] = ()
    ignored: str = ""


ANY = frozenset(Mode)
E = Effect
_STARTING = frozenset({Mode.STARTING, Mode.WAKING})
_STOPPING = frozenset({Mode.STOPPING, Mode.FALLING_ASLEEP})

# (event, the modes it applies in, the mode it moves to (None: stays), effects)
_ROWS: list[tuple[Ev, frozenset[Mode], Mode | None, tuple[Effect, ...]]] = [
    (Ev.START, ANY, Mode.STARTING, (E.NEW_RUN, E.NEW_ENGINE, E.FOLLOW)),
    (Ev.ADOPT, ANY, Mode.STARTING, (E.NEW_RUN, E.FOLLOW)),
    (Ev.STARTED_OUTSIDE, ANY, Mode.STARTING, (E.NEW_RUN, E.FOLLOW)),
    (Ev.WAKE, frozenset({Mode.SLEEPING}), Mode.WAKING, (E.NEW_RUN, E.UNFOLLOW)),
    (Ev.WOKE, frozenset({Mode.WAKING}), None, (E.FOLLOW,)),
    (Ev.READY, _STARTING, Mode.READY, (E.RESOLVE_WAITERS,)),
    (Ev.UNHEALTHY, ANY, Mode.FAILING, ()),
    (Ev.CHECK_FAILED, frozenset({Mode.READY}), Mode.DEGRADED_CHECK, ()),
    (Ev.CHECK_PASSED, frozenset({Mode.DEGRADED_CHECK}), Mode.READY, (E.RESOLVE_WAITERS,)),
    (Ev.PEER_LOST, frozenset({Mode.READY}), Mode.DEGRADED_PEER, ()),
    (Ev.PEER_BACK, frozenset({Mode.DEGRADED_PEER}), Mode.READY, (E.RESOLVE_WAITERS,)),
    (Ev.SYSTEMD_RESTARTS, ANY, Mode.RESTARTING, (E.NEW_RUN, E.FOLLOW)),
    (Ev.RESTART_LATER, ANY, Mode.RESTARTING, (E.CANCEL_RESTART, E.SCHEDULE_RESTART)),
    (Ev.EXIT_FAILED, ANY, Mode.FAILED, ()),
    (Ev.CRASH_LOOP, ANY, Mode.FAILED, (E.FAIL_WAITERS,)),
    (Ev.STOPPED_WITH_MANAGER, ANY, Mode.INACTIVE, ()),
    (Ev.STOPPED_OUTSIDE, ANY, Mode.INACTIVE, (E.FAIL_WAITERS,)),
    (Ev.RESTART, ANY, Mode.RESTARTING, (E.STOP_BEGINS, E.CANCEL_RESTART, E.UNFOLLOW)),
    (Ev.STOP_ASKED, ANY, None, (E.CANCEL_RESTART, E.UNFOLLOW, E.SUPERSEDE_WAITERS)),
    (Ev.STOP, ANY, Mode.STOPPING, (E.STOP_BEGINS,)),
    (Ev.STOPPED, _STOPPING, Mode.INACTIVE, ()),
    (Ev.ALREADY_STOPPED, ANY - {Mode.INACTIVE}, Mode.INACTIVE, ()),
    (Ev.STOP_FAILED, ANY, Mode.FAILED, ()),
    (Ev.SLEEP, ANY, Mode.FALLING_ASLEEP, (E.UNFOLLOW,)),
    (Ev.SLEPT, frozenset({Mode.FALLING_ASLEEP}), Mode.SLEEPING, ()),
    (Ev.FOUND_ASLEEP, ANY, Mode.SLEEPING, (E.UNFOLLOW,)),
    (Ev.START_REFUSED, ANY, Mode.FAILED, (E.FAIL_WAITERS,)),
    (Ev.GIVE_UP, ANY, None, (E.STOP_BEGINS,)),
    (Ev.GAVE_UP, ANY, Mode.FAILED, (E.FAIL_WAITERS,)),
    (Ev.FOUND_STOPPED, ANY, Mode.INACTIVE, ()),
]

# Why an event is ignored in the modes its row leaves out.
_IGNORED = {
    Ev.WAKE: "only a sleeping lane wakes",
    Ev.WOKE: "no wake is under way",
    Ev.READY: "a readiness report counts only while the lane starts (an earlier run's)",
    Ev.CHECK_FAILED: "only a ready lane is degraded by a check (a restart would not fix it)",
    Ev.CHECK_PASSED: "the lane is not degraded by a check",
    Ev.PEER_LOST: "only a ready lane is degraded by a peer out of reach",
    Ev.PEER_BACK: "the lane is not degraded by a peer out of reach",
    Ev.STOPPED: "the stop was overtaken (an exit or a newer request moved the lane)",
    Ev.ALREADY_STOPPED: "the lane is inactive already",
    Ev.SLEPT: "the sleep was overtaken (an exit or a newer request moved the lane)",
}


def _table() -> dict[tuple[Mode, Ev], Outcome]:
    table: dict[tuple[Mode, Ev], Outcome] = {}
    for event, modes, to, effects in _ROWS:
        for mode in modes:
            table[(mode, event)] = Outcome(to, effects)
    for mode in Mode:
        for event in Ev:
            if (mode, event) not in table:
                table[(mode, event)] = Outcome(ignored=_IGNORED[event])
    return table


TABLE = _table()


def decide(mode: Mode, event: Ev) -> Outcome:
    """What `event` does to a lane in `mode` (every pair is in the table)."""
    return TABLE[(mode, event)]
