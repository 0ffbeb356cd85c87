"""The lane model, plain data: states, events, exits, each lane's status, and a step on the
host refused.

No I/O and no decisions: `laned.core.machine.step` is the one way a LaneStatus changes (it
returns a new one), `laned.core.policy` decides, and the API, metrics and state file read it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from enum import Enum
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from laned.core.liveness import EngineSample
from laned.core.modes import SERVING_MODES, STOP_MODES, LaneState, Mode
from laned.core.unit_state import UnitSnapshot

if TYPE_CHECKING:
    from laned.config.model import LaneConfig

__all__ = ["LaneState", "Mode"]  # their home is laned.core.modes


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


SAMPLES_KEPT = 60.0  # seconds of an engine's /metrics samples (its tokens/s over a minute)


def frozen(mapping: Mapping[Any, Any] | None = None) -> Mapping[Any, Any]:
    """A read-only copy of `mapping` (a record's maps are never changed, only replaced)."""
    return MappingProxyType(dict(mapping or {}))


@dataclass(frozen=True)
class Asleep:
    """What a lane's engine is while it sleeps: its processes (the GPU-memory gate leaves
    what they hold to them), the digest of its unit and wrapper when it went to sleep (a
    reload since: it starts cold), and its level (0: not known better than its config's)."""

    pids: frozenset[int] = frozenset()
    digest: str = ""
    level: int = 0


@dataclass(frozen=True)
class Op:
    """The request under way for a lane (an activate, deactivate or restart): its epoch
    (each request's own; a result of an older one is stale), and what it carries along."""

    kind: str  # laned.core.policy.OpKind's values
    epoch: int
    reason: str = ""
    force: bool = False  # start despite preflight errors, stop without draining requests
    unattended: bool = False  # laned's own (at start): a refusal fails the lane, visibly
    evicts: tuple[str, ...] = ()  # the lanes an activation takes off (laned.core.placement)
    stops_asleep: tuple[str, ...] = ()  # of those, the sleepers whose residual is in the way
    from_lane: str = "none"  # the lane it swaps from (laned_swaps_total)
    desired_before: Mapping[str, Desired] = field(default_factory=frozen)  # put back if refused
    started: float = 0.0  # monotonic, for the swap's duration
    # A take-off: the activations that take this lane off, each (lane, epoch), waiting for
    # the answer (several when concurrent activations need the same lane off).
    takers: tuple[tuple[str, int], ...] = ()
    also: tuple[int, ...] = ()  # other requests' callers answered with this one (joined)


@dataclass(frozen=True)
class LaneStatus:
    """Everything laned knows about one lane: one immutable record per lane, replaced by
    the lane machine's step alone (laned.core.machine.step); everyone else reads it.

    What users see (`state`) and the answers the owner asks of it (`stopping`, `woke`,
    `serving`) are derived from `mode`, never stored beside it. The current run (`run`,
    `spec`, `started_at`, `ready_at`, `phases`, `notes`, `start_kind`, `counted`,
    `weights_at_start`) begins again with each start; the rest outlives runs."""

    name: str
    mode: Mode = Mode.INACTIVE
    desired: Desired = Desired.INACTIVE
    since: float = 0.0
    reason: str = ""
    phase: str | None = None
    progress: float | None = None
    restarts: int = 0
    last_exit: LastExit | None = None
    failures: tuple[float, ...] = ()  # times of recent failures
    last_cold_start: float | None = None  # seconds, of the last start that became ready
    last_wake: float | None = None  # seconds, of the last wake from sleep that became ready
    last_phases: Mapping[str, float] = field(default_factory=frozen)  # last good start: phase -> s
    last_starts: Mapping[str, float] = field(default_factory=frozen)  # kind -> s, the last of each
    image_id: str | None = None  # container lanes: the image of the last good start
    checks: Mapping[str, Any] | None = None  # the last acceptance run (laned.gates.acceptance)
    # The current run (not served; state.json keeps none of it).
    run: int = 0  # each start adds one: reports about an older run are dropped
    spec: LaneConfig | None = None  # the config the current run started with (reload: kept)
    started_at: float | None = None  # when the current start began (clock time)
    ready_at: float = 0.0  # when the lane last became ready
    phases: tuple[tuple[str, float], ...] = ()  # this start: (phase, since)
    notes: tuple[str, ...] = ()  # this start: "compile cache hit (...)"
    weights_at_start: Mapping[str, Any] | None = None  # page-cache residency as it began
    # This run: "cold" (weights from disk), "weight-cache" (mapped from the lane's daemon) or
    # "sleep" (woken); what it was expected to be at its start, then what its log said.
    start_kind: str = ""
    # What saw this run's failure first, once it is counted: a run fails once, whichever
    # path (its exit, health probes, a stall, a timeout) saw it first.
    counted: str | None = None
    # The engine process (a new engine begins again): its pinned host buffers from a level-1
    # sleep, which torch keeps until the engine ends (laned.preflight.fit).
    pinned: bool = False
    asleep: Asleep | None = None  # while it sleeps
    residual: Mapping[int, int] = field(default_factory=frozen)  # GPU -> bytes, its last sleep
    # The lane's weight-cache daemon (docs/weight-cache.md): loading, ready, stopping,
    # stopped, failed; None for a lane without one; the bytes its ranks hold; its unit.
    weights: str | None = None
    weights_held: int | None = None
    weights_unit: UnitSnapshot | None = None
    unit: UnitSnapshot | None = None  # the lane's unit as systemd last showed it
    checking: int = 0  # acceptance checks running against it now (they keep it busy)
    samples: tuple[tuple[float, EngineSample], ...] = ()  # its /metrics over SAMPLES_KEPT
    op: Op | None = None  # the request under way

    @property
    def state(self) -> LaneState:
        """What users see of the mode."""
        return self.mode.visible

    @property
    def stopping(self) -> bool:
        """A stop laned asked for is under way (the engine's exit is then not a failure)."""
        return self.mode in STOP_MODES

    @property
    def woke(self) -> bool:
        """The current run became ready from a wake (its swap-in cost)."""
        return self.start_kind == START_SLEEP

    @property
    def serving(self) -> bool:
        """Ready, or degraded by a failed check or a peer out of reach (it still serves)."""
        return self.mode in SERVING_MODES

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
            "last_phases": dict(self.last_phases),
            "weights_at_start": None
            if self.weights_at_start is None
            else dict(self.weights_at_start),
            "image_id": self.image_id,
            "checks": None if self.checks is None else dict(self.checks),
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
