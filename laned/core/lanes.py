"""The lane model, plain data: states, events, exits, each lane's status, and a step on the
host refused.

No I/O and no decisions: `laned.core.policy` decides, the supervisor (the one owner) changes a
LaneStatus, and the API, metrics and state file read it.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from enum import Enum
from typing import TYPE_CHECKING, Any

from laned.core.liveness import EngineSample
from laned.core.machine import LaneState, Mode

if TYPE_CHECKING:
    from laned.config.model import LaneConfig

__all__ = ["LaneState", "Mode"]  # their home is laned.core.machine


class Desired(str, Enum):
    """What the operator asked for."""

    ACTIVE = "active"
    INACTIVE = "inactive"


class Verdict(str, Enum):
    """How an engine exit is judged."""

    FAILURE = "failure"
    REQUESTED = "requested"


@dataclass(frozen=True)
class LastExit:
    """An engine exit: its own status (not the wrapper's mapping) or signal, the verdict,
    and why (for a failure: what laned saw first, e.g. failed health probes)."""

    code: int | None
    signal: int | None
    at: float
    verdict: Verdict
    oom_killed: bool = False
    reason: str = ""

    def to_json(self) -> dict[str, Any]:
        """As stored and served."""
        data = asdict(self)
        data["verdict"] = self.verdict.value
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> LastExit:
        """From what to_json stored."""
        return cls(
            data.get("code"),
            data.get("signal"),
            float(data["at"]),
            Verdict(data["verdict"]),
            bool(data.get("oom_killed", False)),
            str(data.get("reason", "")),
        )


@dataclass(frozen=True)
class Refused:
    """A step that cannot be done: why (for the lane's reason) and what to do."""

    reason: str
    hint: str = ""


class EventKind(str, Enum):
    """A transition, or something worth knowing that changes no state (a note)."""

    TRANSITION = "transition"
    PREFLIGHT = "preflight"
    GATE = "gate"
    PREPARE = "prepare"
    CHECK = "check"
    STARTUP = "startup"  # what the engine said of its start: a compile cache hit, a skipped step
    DRAIN = "drain"  # requests at laned's OpenAI endpoint waited for (or cut) before a stop
    PEER = "peer"  # a lane over several hosts: what was asked of (or seen at) another rank
    MANAGER = "manager"  # the user manager re-executed, out of reach, back (or a new one)
    EXIT = "exit"  # how an engine's exit was judged where a transition does not say it
    SLEEP = "sleep"  # vLLM's sleep mode: a sleep or a wake that could not be done, and why
    CANARY = "canary"  # the canary's answer kept, or found different (laned.core.canary)
    SCHEDULE = "schedule"  # a swap the requests waiting asked for, and why (laned.core.schedule)
    PREFETCH = "prefetch"  # the weights read ahead during a swap; how much was resident at a start
    WEIGHTS = "weights"  # the lane's weight-cache daemon: started, stopped, restarted, died


@dataclass(frozen=True)
class Event:
    """One transition of one lane (or, for other kinds, a note with from == to)."""

    at: float
    lane: str
    from_state: LaneState
    to_state: LaneState
    reason: str
    kind: EventKind = EventKind.TRANSITION

    def to_json(self) -> dict[str, Any]:
        """As stored and served."""
        return {
            "at": self.at,
            "lane": self.lane,
            "kind": self.kind.value,
            "from": self.from_state.value,
            "to": self.to_state.value,
            "reason": self.reason,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Event:
        """From what to_json stored."""
        return cls(
            float(data["at"]),
            str(data["lane"]),
            LaneState(data["from"]),
            LaneState(data["to"]),
            str(data["reason"]),
            EventKind(data.get("kind", "transition")),
        )


START_COLD, START_WEIGHT_CACHE, START_SLEEP = "cold", "weight-cache", "sleep"


@dataclass
class LaneStatus:
    """Everything laned knows about one lane, its current run included: one record per lane,
    changed by the lane machine's runner alone (laned.owner.ledger.Ledger); everyone else
    reads it. `state` is what users see of `mode` (laned.core.machine)."""

    name: str
    state: LaneState = LaneState.INACTIVE
    mode: Mode = Mode.INACTIVE
    desired: Desired = Desired.INACTIVE
    since: float = 0.0
    reason: str = ""
    phase: str | None = None
    progress: float | None = None
    restarts: int = 0
    last_exit: LastExit | None = None
    failures: list[float] = field(default_factory=list)  # times of recent failures
    last_cold_start: float | None = None  # seconds, of the last start that became ready
    last_wake: float | None = None  # seconds, of the last wake from sleep that became ready
    started_at: float | None = None  # when the current start began (clock time)
    phases: list[tuple[str, float]] = field(default_factory=list)  # this start: (phase, since)
    notes: list[str] = field(default_factory=list)  # this start: "compile cache hit (...)"
    last_phases: dict[str, float] = field(default_factory=dict)  # last good start: phase -> s
    weights_at_start: dict[str, Any] | None = None  # page-cache residency as the last start began
    image_id: str | None = None  # container lanes: the image of the last good start
    checks: dict[str, Any] | None = None  # the last acceptance run (see laned.gates.acceptance)
    # The current run (not served; state.json keeps none of it).
    run: int = 0  # each start adds one: reports about an older run are dropped
    spec: LaneConfig | None = None  # the config the current run started with (reload: kept)
    ready_at: float = 0.0  # when the lane last became ready
    # The run whose failure is counted already, and what saw it: a run fails once,
    # whichever path (its exit, health probes, a stall, a timeout) saw it first.
    failed: tuple[int, str] | None = None
    stopping: bool = False  # a stop laned asked for is under way (its exit is not a failure)
    woke: bool = False  # the current run became ready from a wake (its swap-in cost)
    # This run: "cold" (weights from disk), "weight-cache" (mapped from the lane's daemon) or
    # "sleep" (woken); what it was expected to be at its start, then what its log said.
    start_kind: str = ""
    last_starts: dict[str, float] = field(default_factory=dict)  # kind -> s, the last of each
    # The lane's weight-cache daemon (docs/weight-cache.md): loading, ready, stopping,
    # stopped, failed; None for a lane without one.
    weights: str | None = None
    weights_held: int | None = None  # bytes its ranks hold on the GPUs, by their own word
    checking: int = 0  # acceptance checks running against it now (they keep it busy)
    samples: deque[tuple[float, EngineSample]] = field(default_factory=deque)  # /metrics, 60 s
    sleepers: frozenset[int] = frozenset()  # asleep: its engine's processes (the GPU gate)
    slept_as: str = ""  # asleep: the digest of its unit and wrapper when it went to sleep
    slept_level: int = 0  # asleep: the level it sleeps at (0: its own, not known better)
    pinned: bool = False  # its engine slept at level 1: it keeps those pinned buffers (fit.py)
    residual: dict[int, int] = field(default_factory=dict)  # GPU index -> bytes, its last sleep

    def to_json(self) -> dict[str, Any]:
        """As served by the API and stored in state_dir."""
        return {
            "name": self.name,
            "state": self.state.value,
            "desired": self.desired.value,
            "since": self.since,
            "reason": self.reason,
            "phase": self.phase,
            "progress": self.progress,
            "restarts": self.restarts,
            "last_exit": self.last_exit.to_json() if self.last_exit else None,
            "last_cold_start": self.last_cold_start,
            "last_wake": self.last_wake,
            "start_kind": self.start_kind or None,
            "last_starts": dict(self.last_starts),
            "weights": self.weights,
            "weights_held": self.weights_held,
            "last_phases": self.last_phases,
            "weights_at_start": self.weights_at_start,
            "image_id": self.image_id,
            "checks": self.checks,
        }

    def startup(self, now: float) -> dict[str, Any] | None:
        """While starting: elapsed time, each phase so far, and what the last cold start predicts."""
        if self.state is not LaneState.STARTING or self.started_at is None:
            return None
        elapsed = max(now - self.started_at, 0.0)
        expected = self.last_starts.get(self.start_kind) or self.last_cold_start
        if self.start_kind == START_WEIGHT_CACHE and START_WEIGHT_CACHE not in self.last_starts:
            expected = None  # a first restart from the weight cache: nothing measured yet
        return {
            "elapsed": round(elapsed, 1),
            "expected": expected,
            "remaining": None if expected is None else round(max(expected - elapsed, 0.0), 1),
            "phases": [
                {"phase": name, "seconds": seconds}
                for name, seconds in phase_durations(self.phases, now)
            ],
            "notes": list(self.notes),
            "kind": self.start_kind or None,
        }


def phase_durations(phases: Iterable[tuple[str, float]], end: float) -> list[tuple[str, float]]:
    """(phase, seconds) from (phase, since) marks: each lasts until the next one (or `end`)."""
    marks = list(phases)
    out = []
    for i, (name, since) in enumerate(marks):
        until = marks[i + 1][1] if i + 1 < len(marks) else end
        out.append((name, round(max(until - since, 0.0), 3)))
    return out
