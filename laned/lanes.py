"""The lane model and the supervisor's pure decisions: no I/O, no asyncio, no clocks of its own.

States, events and exits are plain data; the functions here decide (is this exit a
failure, how long to back off, is this a crash loop, is this engine stalled, which
startup phase does this log line announce) and the supervisor acts on the answers.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from enum import Enum
from typing import Any


class LaneState(str, Enum):
    """Where a lane is. `degraded`: running but unhealthy or stalled; `failed`: given up."""

    INACTIVE = "inactive"
    STARTING = "starting"
    READY = "ready"
    DEGRADED = "degraded"
    RESTARTING = "restarting"
    STOPPING = "stopping"
    FAILED = "failed"


class Desired(str, Enum):
    """What the operator asked for."""

    ACTIVE = "active"
    INACTIVE = "inactive"


class Verdict(str, Enum):
    """How an engine exit is judged."""

    FAILURE = "failure"
    REQUESTED = "requested"


RUNNING_STATES = {LaneState.STARTING, LaneState.READY, LaneState.DEGRADED}


@dataclass(frozen=True)
class LastExit:
    """An engine exit: its own status (not the wrapper's mapping) or signal, and the verdict."""

    code: int | None
    signal: int | None
    at: float
    verdict: Verdict
    oom_killed: bool = False

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
        )


class EventKind(str, Enum):
    """A transition, or something worth knowing that changes no state (a note)."""

    TRANSITION = "transition"
    PREFLIGHT = "preflight"
    GATE = "gate"
    PREPARE = "prepare"
    CHECK = "check"


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


@dataclass
class LaneStatus:
    """Everything laned knows about one lane; owned and mutated by the supervisor alone."""

    name: str
    state: LaneState = LaneState.INACTIVE
    desired: Desired = Desired.INACTIVE
    since: float = 0.0
    reason: str = ""
    phase: str | None = None
    progress: float | None = None
    restarts: int = 0
    last_exit: LastExit | None = None
    failures: list[float] = field(default_factory=list)  # times of recent failures
    last_cold_start: float | None = None  # seconds, of the last start that became ready
    started_at: float | None = None  # when the current start began (clock time)
    phases: list[tuple[str, float]] = field(default_factory=list)  # this start: (phase, since)
    last_phases: dict[str, float] = field(default_factory=dict)  # last good start: phase -> s
    image_id: str | None = None  # container lanes: the image of the last good start
    checks: dict[str, Any] | None = None  # the last acceptance run (see laned.acceptance)

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
            "last_phases": self.last_phases,
            "image_id": self.image_id,
            "checks": self.checks,
        }

    def startup(self, now: float) -> dict[str, Any] | None:
        """While starting: elapsed time, each phase so far, and what the last cold start predicts."""
        if self.state is not LaneState.STARTING or self.started_at is None:
            return None
        elapsed = max(now - self.started_at, 0.0)
        expected = self.last_cold_start
        return {
            "elapsed": round(elapsed, 1),
            "expected": expected,
            "remaining": None if expected is None else round(max(expected - elapsed, 0.0), 1),
            "phases": [
                {"phase": name, "seconds": seconds}
                for name, seconds in phase_durations(self.phases, now)
            ],
        }


def phase_durations(phases: Iterable[tuple[str, float]], end: float) -> list[tuple[str, float]]:
    """(phase, seconds) from (phase, since) marks: each lasts until the next one (or `end`)."""
    marks = list(phases)
    out = []
    for i, (name, since) in enumerate(marks):
        until = marks[i + 1][1] if i + 1 < len(marks) else end
        out.append((name, round(max(until - since, 0.0), 3)))
    return out


# --- exits ------------------------------------------------------------------------------


def decode_status(status: int) -> tuple[int | None, int | None]:
    """Split a shell-style status into (code, signal): 137 -> (None, 9), 3 -> (3, None)."""
    if status > 128 and status - 128 < 65:
        return None, status - 128
    return status, None


def judge_exit(requested_by_laned: bool, requested_by_systemd: bool) -> Verdict:
    """An exit is `requested` only when someone asked for the stop; anything else — status 0 too — fails."""
    return Verdict.REQUESTED if requested_by_laned or requested_by_systemd else Verdict.FAILURE


# --- restart policy ---------------------------------------------------------------------


def recent(failures: Iterable[float], now: float, interval: float) -> list[float]:
    """The failure times within the last `interval` seconds."""
    return [t for t in failures if now - t <= interval]


def is_crash_loop(failures: Iterable[float], now: float, burst: int, interval: float) -> bool:
    """`burst` failures within `interval` seconds: stop restarting (systemd's StartLimitBurst rule)."""
    return len(recent(failures, now, interval)) >= burst


def backoff_delay(base: float, failures: int, cap: float) -> float:
    """Exponential backoff: base, 2×base, 4×base … up to `cap`, for the n-th failure in a row."""
    if failures <= 1:
        return min(base, cap)
    return float(min(base * 2.0 ** (failures - 1), cap))


# --- stall detection --------------------------------------------------------------------


@dataclass(frozen=True)
class EngineSample:
    """What one scrape of an engine's /metrics says."""

    running: float
    waiting: float
    generation_tokens: float
    prompt_tokens: float
    kv_cache_usage: float = 0.0


@dataclass
class StallDetector:
    """Requests running or waiting while no token moves, for `after` seconds, is a stall (vLLM #39863)."""

    after: float
    since: float | None = None
    tokens: tuple[float, float] | None = None

    def observe(self, sample: EngineSample, now: float) -> bool:
        """Feed one sample; True once the engine has been stalled for `after` seconds."""
        busy = sample.running + sample.waiting > 0
        tokens = (sample.generation_tokens, sample.prompt_tokens)
        if not busy or tokens != self.tokens:
            self.since = now if busy else None
            self.tokens = tokens
            return False
        if self.since is None:
            self.since = now
        return now - self.since >= self.after

    def reset(self) -> None:
        """Forget what was seen (after a restart)."""
        self.since, self.tokens = None, None


# --- startup phases from the engine's log ------------------------------------------------

_PHASES: list[tuple[re.Pattern[str], str]] = [
    (
        re.compile(r"Loading safetensors checkpoint shards:\s*(\d+)% Completed \| (\d+)/(\d+)"),
        "loading weights",
    ),
    (re.compile(r"Loading weights took"), "weights loaded"),
    (re.compile(r"Capturing CUDA graphs.*?(\d+)%\|.*?\| (\d+)/(\d+)"), "capturing CUDA graphs"),
    (re.compile(r"[Aa]utotun\w*.*?(\d+)/(\d+)"), "FlashInfer autotune"),
    (re.compile(r"[Aa]utotun"), "FlashInfer autotune"),
    (re.compile(r"DeepG[Ee][Mm][Mm].*?(\d+)/(\d+)"), "DeepGEMM JIT"),
    (re.compile(r"DeepG[Ee][Mm][Mm]|deep_gemm"), "DeepGEMM JIT"),
    (re.compile(r"torch\.compile|Compiling a graph"), "torch.compile"),
    (re.compile(r"Available KV cache memory"), "profiling memory"),
    (re.compile(r"Starting vLLM API server"), "starting API server"),
    (re.compile(r"Application startup complete"), "serving"),
    (re.compile(r"Starting to load model|Loading model"), "loading model"),
]


def parse_phase(line: str) -> tuple[str, float | None] | None:
    """The startup phase a vLLM log line announces, with a percent where it gives one."""
    for pattern, phase in _PHASES:
        match = pattern.search(line)
        if not match:
            continue
        numbers = [int(g) for g in match.groups() if g is not None]
        if len(numbers) >= 2 and numbers[-1] > 0:
            return phase, round(100.0 * numbers[-2] / numbers[-1], 1)
        return phase, None
    return None
