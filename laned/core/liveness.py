"""Liveness decisions over what probes read, pure: a stalled engine, a host short of memory.

The liveness watcher feeds these with samples and times and sends the owner an
observation when one of them says so.
"""

from __future__ import annotations

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


@dataclass
class StallDetector:
    """Requests running or waiting while nothing moves — no token, no engine step, no change
    of the KV cache — for `after` seconds is a stall (vLLM #39863)."""

    after: float
    since: float | None = None
    progress: tuple[float, ...] | None = None

    def observe(self, sample: EngineSample, now: float) -> bool:
        """Feed one sample; True once the engine has been stalled for `after` seconds."""
        busy = sample.running + sample.waiting > 0
        progress = sample.progress()
        if not busy or progress != self.progress:
            self.since = now if busy else None
            self.progress = progress
            return False
        if self.since is None:
            self.since = now
        return now - self.since >= self.after

    def unanswered(self, now: float) -> bool:
        """A scrape that got no answer while /health answers: no progress seen. While the
        last sample had requests running or waiting, the stall clock runs on (llama-server
        answers /metrics from its task loop, so a wedged decode loop can leave it
        unanswered: tools/server/server-context.cpp); otherwise nothing is judged."""
        return self.since is not None and now - self.since >= self.after


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
