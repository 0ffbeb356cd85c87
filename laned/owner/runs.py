"""What the owner keeps of each lane's runs besides its LaneStatus: one record per lane."""

from __future__ import annotations

import asyncio
from collections import deque
from dataclasses import dataclass, field

from laned.core.liveness import EngineSample


@dataclass
class LaneRun:
    """What the owner keeps of a lane's runs, besides its LaneStatus (the ledger's): one
    record per lane."""

    number: int = 0  # each start adds one: reports about an older run are dropped
    started_at: float | None = None  # when the current run started
    ready_at: float = 0.0  # when the lane last became ready
    follow: asyncio.Task[None] | None = None  # the watcher of the current run
    restart: asyncio.TimerHandle | None = None  # a restart after a failure, waiting
    poke: asyncio.Event = field(default_factory=asyncio.Event)  # look again now
    samples: deque[tuple[float, EngineSample]] = field(default_factory=deque)  # /metrics, 60 s
    # The run whose failure is counted already, and what saw it: a run fails once,
    # whichever path (its exit, health probes, a stall, a timeout) saw it first.
    failed: tuple[int, str] | None = None
    stopping: bool = False  # a stop laned asked for is under way
    check_degraded: bool = False  # degraded by a failed check, still serving
