"""Liveness decisions over what probes read, pure: a stalled engine, a host short of memory.

The liveness watcher feeds these with samples and times and sends the owner an
observation when one of them says so.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass


@dataclass(frozen=True)
class EngineSample:
    """What one scrape of an engine's /metrics says."""

    running: float
    waiting: float
    generation_tokens: float
    prompt_tokens: float
    kv_cache_usage: float = 0.0
    steps: float = 0.0  # engine steps taken (vllm:iteration_tokens_total's count), where exported

    def progress(self) -> tuple[float, float, float, float]:
        """What moves while an engine works: tokens, steps, KV-cache usage.

        vLLM counts a request's prompt tokens only when its prefill ends
        (vllm/v1/metrics/stats.py), so a 500K-token prefill at 4096 tokens a step runs for
        minutes with both token counters flat; its steps and its KV-cache usage still grow."""
        return (self.generation_tokens, self.prompt_tokens, self.steps, self.kv_cache_usage)


class Unanswered(enum.Enum):
    """A scrape of /metrics that the engine did not answer (timed out, connection dropped),
    unlike a page it answered without laned's numbers (None: no judgement)."""

    UNANSWERED = "unanswered"


UNANSWERED = Unanswered.UNANSWERED

# Scrapes unanswered in a row before they count as a stall by themselves: one lost is not
# a verdict.
UNANSWERED_IN_A_ROW = 2


@dataclass
class StallDetector:
    """Requests running or waiting while nothing moves — no token, no engine step, no change
    of the KV cache — for `after` seconds is a stall (vLLM #39863). So is an engine that
    leaves its /metrics unanswered for `after` seconds while its /health answers."""

    after: float
    since: float | None = None
    progress: tuple[float, ...] | None = None
    unanswered_since: float | None = None
    unanswered_count: int = 0

    def observe(self, sample: EngineSample, now: float) -> bool:
        """Feed one sample; True once the engine has been stalled for `after` seconds."""
        self.answered()
        busy = sample.running + sample.waiting > 0
        progress = sample.progress()
        if not busy or progress != self.progress:
            self.since = now if busy else None
            self.progress = progress
            return False
        if self.since is None:
            self.since = now
        return now - self.since >= self.after

    def answered(self) -> None:
        """The engine answered /metrics (with laned's numbers or without them)."""
        self.unanswered_since, self.unanswered_count = None, 0

    def unanswered(self, now: float) -> bool:
        """A scrape that got no answer while /health answers: no progress seen. While the
        last sample had requests running or waiting, the stall clock runs on from then. And
        scrapes unanswered in a row for `after` seconds (at least UNANSWERED_IN_A_ROW of
        them) are a stall whatever the last sample said: an engine answers /metrics idle or
        busy, but llama-server answers it from its task loop, which a wedged decode leaves
        unanswered (tools/server/server-context.cpp) — and the request that wedged it may
        have come after the last scrape, which then read it idle."""
        if self.unanswered_since is None:
            self.unanswered_since = now
        self.unanswered_count += 1
        if self.since is not None and now - self.since >= self.after:
            return True
        return (
            self.unanswered_count >= UNANSWERED_IN_A_ROW
            and now - self.unanswered_since >= self.after
        )

    def unanswered_for(self, now: float) -> float:
        """How long /metrics has gone unanswered (0: it answers)."""
        return 0.0 if self.unanswered_since is None else now - self.unanswered_since


@dataclass
class MemoryFloor:
    """MemAvailable below `floor_gib` for `for_seconds` in a row: the host is about to swap
    or OOM-kill, so the lane is stopped before it takes the host down (0 disables it)."""

    floor_gib: float
    for_seconds: float
    low_since: float | None = None

    def observe(self, available_gib: float | None, now: float) -> bool:
        """Feed one reading; True once it has stayed below the floor long enough."""
        if self.floor_gib <= 0 or available_gib is None or available_gib >= self.floor_gib:
            self.low_since = None
            return False
        if self.low_since is None:
            self.low_since = now
        return now - self.low_since >= self.for_seconds


def tokens_per_second(window: list[tuple[float, EngineSample]]) -> float:
    """Generation tokens per second over a window of (time, sample), oldest first."""
    if len(window) < 2:
        return 0.0
    (t0, first), (t1, last) = window[0], window[-1]
    if t1 <= t0:
        return 0.0
    return max((last.generation_tokens - first.generation_tokens) / (t1 - t0), 0.0)


def engine_summary(window: list[tuple[float, EngineSample]]) -> dict[str, float]:
    """The engine's load as the lane's view shows it: the last sample, and tokens/s."""
    last = window[-1][1]
    return {
        "requests_running": last.running,
        "requests_waiting": last.waiting,
        "kv_cache_usage": last.kv_cache_usage,
        "generation_tokens_per_second": round(tokens_per_second(window), 3),
    }
