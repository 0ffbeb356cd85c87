"""Where a lane is: the modes the lane machine knows (laned.core.machine) and the state each
shows users. Pure data.

A mode is finer than the state a user sees: what flags once encoded (a wake under way, a
lane degraded by a check but still serving, a stop of laned's under way, a stop that puts an
engine to sleep, giving up) is a mode of its own, and each mode shows as one LaneState.
"""

from __future__ import annotations

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
    STARTING = "starting"  # a start: the unit started, the engine not ready yet
    WAKING = "waking"  # a start from sleep: woken, not ready yet
    READY = "ready"
    FAILING = "failing"  # failed probes, a stall, a dead engine: a restart or giving up follows
    DEGRADED_CHECK = "degraded-check"  # an acceptance check failed; it still serves
    DEGRADED_PEER = "degraded-peer"  # a peer rank is out of reach; it still serves
    RESTARTING = "restarting"  # to be started again: after its backoff, or by systemd
    RESTART_STOPPING = "restart-stopping"  # laned stops it to start it again
    STOPPING = "stopping"  # laned stops it
    FALLING_ASLEEP = "falling-asleep"  # being put to sleep for a swap
    SLEEPING = "sleeping"
    GIVING_UP = "giving-up"  # laned stops it to leave it failed (a start timeout, a guard)
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
    Mode.RESTART_STOPPING: LaneState.RESTARTING,
    Mode.STOPPING: LaneState.STOPPING,
    Mode.FALLING_ASLEEP: LaneState.STOPPING,
    Mode.SLEEPING: LaneState.SLEEPING,
    Mode.GIVING_UP: LaneState.STOPPING,
    Mode.FAILED: LaneState.FAILED,
}

SERVING_MODES = frozenset({Mode.READY, Mode.DEGRADED_CHECK, Mode.DEGRADED_PEER})
# A stop laned asked for is under way: the engine's exit then is not a failure.
STOP_MODES = frozenset({Mode.RESTART_STOPPING, Mode.STOPPING, Mode.GIVING_UP})
STARTING_MODES = frozenset({Mode.STARTING, Mode.WAKING})
