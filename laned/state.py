"""laned's persisted state in state_dir/state.json: desired lanes, counters, recent events.

Written atomically after every transition, read once at start. systemd stays the truth
about what runs; this file is the truth about what the operator asked for.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from laned.lanes import Desired, Event, LastExit
from laned.render import write_atomic

STATE_FILE = "state.json"
EVENTS_KEPT = 500


@dataclass
class Saved:
    """What survives a restart of laned."""

    desired: dict[str, Desired] = field(default_factory=dict)
    restarts: dict[str, int] = field(default_factory=dict)
    last_exit: dict[str, LastExit] = field(default_factory=dict)
    last_cold_start: dict[str, float] = field(default_factory=dict)
    failed: dict[str, str] = field(default_factory=dict)
    last_phases: dict[str, dict[str, float]] = field(default_factory=dict)
    image_ids: dict[str, str] = field(default_factory=dict)  # of each lane's last good start
    events: list[Event] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        """As written to state.json."""
        return {
            "version": 1,
            "desired": {k: v.value for k, v in sorted(self.desired.items())},
            "restarts": dict(sorted(self.restarts.items())),
            "last_exit": {k: v.to_json() for k, v in sorted(self.last_exit.items())},
            "last_cold_start": dict(sorted(self.last_cold_start.items())),
            "failed": dict(sorted(self.failed.items())),
            "last_phases": dict(sorted(self.last_phases.items())),
            "image_ids": dict(sorted(self.image_ids.items())),
            "events": [e.to_json() for e in self.events[-EVENTS_KEPT:]],
        }


def load(state_dir: str) -> Saved:
    """Read state.json; a missing or unreadable file is an empty state (and never fatal)."""
    try:
        with open(f"{state_dir}/{STATE_FILE}", encoding="utf-8") as handle:
            data = json.load(handle)
        return Saved(
            desired={k: Desired(v) for k, v in data.get("desired", {}).items()},
            restarts={k: int(v) for k, v in data.get("restarts", {}).items()},
            last_exit={k: LastExit.from_json(v) for k, v in data.get("last_exit", {}).items()},
            last_cold_start={k: float(v) for k, v in data.get("last_cold_start", {}).items()},
            failed={k: str(v) for k, v in data.get("failed", {}).items()},
            last_phases={
                k: {str(p): float(t) for p, t in v.items()}
                for k, v in data.get("last_phases", {}).items()
            },
            image_ids={k: str(v) for k, v in data.get("image_ids", {}).items()},
            events=[Event.from_json(e) for e in data.get("events", [])],
        )
    except (OSError, ValueError, KeyError, TypeError):
        return Saved()


def save(state_dir: str, saved: Saved) -> None:
    """Write state.json atomically."""
    write_atomic(f"{state_dir}/{STATE_FILE}", json.dumps(saved.to_json(), indent=1) + "\n", 0o600)


def checks_path(state_dir: str, lane: str) -> str:
    """Where a lane's last acceptance run is kept."""
    return f"{state_dir}/checks/{lane}.json"


def load_checks(state_dir: str, lane: str) -> dict[str, Any] | None:
    """The lane's last acceptance run; None when there is none (or it is unreadable)."""
    try:
        with open(checks_path(state_dir, lane), encoding="utf-8") as handle:
            data = json.load(handle)
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def save_checks(state_dir: str, lane: str, run: dict[str, Any]) -> None:
    """Keep the lane's last acceptance run (atomically)."""
    write_atomic(checks_path(state_dir, lane), json.dumps(run, indent=1) + "\n", 0o600)
