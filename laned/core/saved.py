"""What survives a restart of laned, as plain data: desired lanes, counters, recent events,
the day's transitions. laned.adapters.state reads and writes it as state_dir/state.json; the
owner's book (laned.owner.book) takes it up at start and hands a copy to the writer.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from laned.core.lanes import Desired, Event, LastExit

EVENTS_KEPT = 500
HISTORY_SECONDS = 24 * 3600  # transitions kept for the status page's timeline
HISTORY_KEPT = 5000


@dataclass
class Saved:
    """What survives a restart of laned."""

    desired: dict[str, Desired] = field(default_factory=dict)
    restarts: dict[str, int] = field(default_factory=dict)
    last_exit: dict[str, LastExit] = field(default_factory=dict)
    last_cold_start: dict[str, float] = field(default_factory=dict)
    last_starts: dict[str, dict[str, float]] = field(default_factory=dict)  # lane -> kind -> s
    failed: dict[str, str] = field(default_factory=dict)
    last_phases: dict[str, dict[str, float]] = field(default_factory=dict)
    image_ids: dict[str, str] = field(default_factory=dict)  # of each lane's last good start
    events: list[Event] = field(default_factory=list)
    # Every transition of the last HISTORY_SECONDS, as (at, lane, from, to): the timeline of
    # which lane held each group, kept apart from the events that notes crowd out.
    history: list[tuple[float, str, str, str]] = field(default_factory=list)
    problem: str | None = None  # why state.json could not be read (then everything is empty)

    def to_json(self) -> dict[str, Any]:
        """As written to state.json."""
        return {
            "version": 1,
            "desired": {k: v.value for k, v in sorted(self.desired.items())},
            "restarts": dict(sorted(self.restarts.items())),
            "last_exit": {k: v.to_json() for k, v in sorted(self.last_exit.items())},
            "last_cold_start": dict(sorted(self.last_cold_start.items())),
            "last_starts": {
                k: dict(sorted(v.items())) for k, v in sorted(self.last_starts.items())
            },
            "failed": dict(sorted(self.failed.items())),
            "last_phases": dict(sorted(self.last_phases.items())),
            "image_ids": dict(sorted(self.image_ids.items())),
            "events": [e.to_json() for e in self.events[-EVENTS_KEPT:]],
            "history": [list(h) for h in self.history[-HISTORY_KEPT:]],
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Saved:
        """As read from state.json (ValueError, KeyError, TypeError or AttributeError where it
        is not what `to_json` writes)."""
        return cls(
            desired={k: Desired(v) for k, v in data.get("desired", {}).items()},
            restarts={k: int(v) for k, v in data.get("restarts", {}).items()},
            last_exit={k: LastExit.from_json(v) for k, v in data.get("last_exit", {}).items()},
            last_cold_start={k: float(v) for k, v in data.get("last_cold_start", {}).items()},
            last_starts={
                k: {str(kind): float(t) for kind, t in v.items()}
                for k, v in data.get("last_starts", {}).items()
            },
            failed={k: str(v) for k, v in data.get("failed", {}).items()},
            last_phases={
                k: {str(p): float(t) for p, t in v.items()}
                for k, v in data.get("last_phases", {}).items()
            },
            image_ids={k: str(v) for k, v in data.get("image_ids", {}).items()},
            events=[Event.from_json(e) for e in data.get("events", [])],
            history=[(float(a), str(n), str(f), str(t)) for a, n, f, t in data.get("history", [])],
        )
