"""What the owner reports as it happens, to whoever records it: a no-op base here (the pure
core and the owner need no metrics library); `laned.api.metrics.LanedMetrics` records."""

from __future__ import annotations


class Recorder:
    """What the supervisor reports as it happens (a no-op base; LanedMetrics records)."""

    def exit(self, lane: str, code: int | None, signal: int | None, verdict: str) -> None:
        """An engine exited."""

    def restart(self, lane: str, reason: str) -> None:
        """laned restarts a lane; `reason` is failure, health, stalled or requested."""

    def failure(self, lane: str, seen_by: str) -> None:
        """A run of the lane failed (counted once toward its crash loop); `seen_by`: the path
        that saw it first (exit, health, stalled, start-timeout, memory-guard)."""

    def probe_failure(self, lane: str) -> None:
        """A health probe of a ready lane failed."""

    def stall(self, lane: str) -> None:
        """A ready lane was found stalled."""

    def swap(self, from_lane: str, to_lane: str, result: str, seconds: float) -> None:
        """An activation ended: ready, failed or superseded."""

    def cold_start(self, lane: str, seconds: float) -> None:
        """A start became ready after `seconds`."""

    def start(self, lane: str, kind: str, seconds: float) -> None:
        """A start of `kind` (cold, weight-cache, sleep) became ready after `seconds`."""

    def sleep_mode(self, lane: str, operation: str, seconds: float) -> None:
        """A lane went to sleep (`sleep`: /sleep until it says it sleeps), or a wake became
        ready (`wake`: from the wake's start to ready), after `seconds`."""

    def canary_mismatch(self, lane: str, after: str) -> None:
        """The canary answered differently after a `wake` or a `start`."""

    def reload(self, result: str) -> None:
        """A config reload was applied or refused."""

    def preflight_refused(self, lane: str) -> None:
        """Preflight found errors before an activation."""

    def gpu_gate(self, lane: str, released: bool, seconds: float) -> None:
        """The GPU-memory gate opened (or timed out) after `seconds`."""

    def schedule_swap(self, lane: str, cause: str) -> None:
        """The requests waiting asked for a swap to the lane (laned.core.schedule's cause)."""

    def proxy_answer(self, lane: str, code: int) -> None:
        """laned's OpenAI endpoint answered a request for the lane (`none`: no lane) with `code`."""

    def proxy_queue_wait(self, lane: str, seconds: float) -> None:
        """A request waited `seconds` for its lane to be ready."""

    def proxy_overhead(self, lane: str, seconds: float) -> None:
        """laned spent `seconds` on a request before it went to the engine (no queue wait)."""
