"""laned's own Prometheus metrics (prometheus_client, its own registry).

Gauges that describe the present (lane state, desired, ready, the engine summary) are read
at scrape time from a `LaneSource` (the front); counters and histograms of things that happened are fed
by the supervisor through the `Recorder` methods. Labels are bounded: lane names come from
the config, states and verdicts from fixed sets, exit codes are at most 0-255 and signals.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest

from laned.api.budget import Budget
from laned.api.present import LaneSource, _label, _value, render_present
from laned.core.facts import GpuReading, HostFacts
from laned.core.policy import RestartKind
from laned.core.recorder import Recorder

# The exposition format laned writes (its routes and its door answer with this type).
METRICS_MEDIA = "text/plain; version=0.0.4; charset=utf-8"
DURATION_BUCKETS = (1, 5, 15, 30, 60, 120, 300, 600, 1200, 1800, 3600, float("inf"))
SLEEP_BUCKETS = (
    0.1,
    0.25,
    0.5,
    1,
    2,
    5,
    10,
    30,
    60,
    120,
    300,
    float("inf"),
)  # seconds, not minutes


class LanedMetrics(Recorder):
    """The registry served at /metrics."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self._zeroed: set[str] = set()
        self._rendered: bytes | None = None  # the counters and histograms, at their last change
        self._changed = True
        self.source: LaneSource | None = None
        self.host: Callable[[], Awaitable[HostFacts]] | None = None  # the GPUs, read at a scrape
        self._reading: asyncio.Future[HostFacts] | None = None  # the last reading, shared
        self._read_at = 0.0  # when it began (monotonic)
        self.budget: Budget | None = None  # the listener's memory of requests in flight
        r = self.registry
        self.exits = Counter(
            "laned_engine_exits",
            "Engine exits by exit code (or signal) and verdict.",
            ["lane", "code", "verdict"],
            registry=r,
        )
        self.restarts = Counter(
            "laned_restarts", "Lane restarts by reason.", ["lane", "reason"], registry=r
        )
        self.failures = Counter(
            "laned_lane_failures",
            "Failed runs of a lane, each counted once toward its crash loop, by the path that "
            "saw the failure first (exit, health, stalled, start-timeout, memory-guard).",
            ["lane", "seen_by"],
            registry=r,
        )
        self.probe_failures = Counter(
            "laned_health_probe_failures",
            "Failed health probes of ready lanes.",
            ["lane"],
            registry=r,
        )
        self.stalls = Counter(
            "laned_lane_stalls",
            "Ready lanes found stalled (busy, no token moving).",
            ["lane"],
            registry=r,
        )
        self.swaps = Counter(
            "laned_swaps",
            "Activations by the lane they replaced and their result.",
            ["from_lane", "to_lane", "result"],
            registry=r,
        )
        self.swap_seconds = Histogram(
            "laned_swap_duration_seconds",
            "Time from activate to ready, by the lane replaced (none: nothing ran) and the lane.",
            ["from_lane", "to_lane"],
            buckets=DURATION_BUCKETS,
            registry=r,
        )
        self.cold_start_seconds = Histogram(
            "laned_cold_start_duration_seconds",
            "Time from unit start to ready.",
            ["lane"],
            buckets=DURATION_BUCKETS,
            registry=r,
        )
        self.start_seconds = Histogram(
            "laned_start_duration_seconds",
            "Time from a start to ready, by its kind: cold (weights from disk), weight-cache "
            "(mapped from the lane's daemon), sleep (a wake).",
            ["lane", "kind"],
            buckets=tuple(sorted(set(SLEEP_BUCKETS) | set(DURATION_BUCKETS))),
            registry=r,
        )
        self.sleep_mode_seconds = Histogram(
            "laned_sleep_mode_duration_seconds",
            "Time to put a lane to sleep, and from a wake's start to ready (docs/sleep.md).",
            ["lane", "operation"],
            buckets=SLEEP_BUCKETS,
            registry=r,
        )
        self.canary_mismatches = Counter(
            "laned_canary_mismatches",
            "The canary answered differently than at the lane's first good start.",
            ["lane", "after"],
            registry=r,
        )
        self.reloads = Counter(
            "laned_config_reloads", "Config reloads by result.", ["result"], registry=r
        )
        self.preflight_refusals = Counter(
            "laned_preflight_refusals",
            "Activations refused (or forced) because preflight found errors.",
            ["lane"],
            registry=r,
        )
        self.gate_seconds = Histogram(
            "laned_gpu_gate_wait_seconds",
            "Time the GPU-memory gate waited before a start, by result.",
            ["lane", "result"],
            buckets=(0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60, 120, 300, float("inf")),
            registry=r,
        )

        self.proxy_answers = Counter(
            "laned_proxy_requests",
            "Requests at laned's OpenAI endpoint by lane and the status code answered.",
            ["lane", "code"],
            registry=r,
        )
        self.schedule_swaps = Counter(
            "laned_schedule_swaps",
            "Swaps the requests waiting at laned's OpenAI endpoint asked for, by lane and cause "
            "(empty, idle, residency, fifo, idle_return: laned.core.schedule).",
            ["lane", "cause"],
            registry=r,
        )
        self.proxy_wait_seconds = Histogram(
            "laned_proxy_queue_wait_seconds",
            "Time a request at laned's OpenAI endpoint waited for its lane to be ready.",
            ["lane"],
            buckets=(0.1, 0.5, 1, *DURATION_BUCKETS),
            registry=r,
        )
        self.proxy_overhead_seconds = Histogram(
            "laned_proxy_overhead_seconds",
            "Time laned spent on a request before it went to the engine (routing; no queue wait).",
            ["lane"],
            buckets=(0.0001, 0.00025, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.1, float("inf")),
            registry=r,
        )

    def attach(
        self, source: LaneSource, host: Callable[[], Awaitable[HostFacts]] | None = None
    ) -> None:
        """Export the lanes' present state at every scrape (and the GPUs `host` reads)."""
        self.source = source
        self.host = host

    async def scrape(self) -> bytes:
        """`render`, then the GPUs' memory (where laned reads GPUs): read at most once every
        GPU_FRESH seconds, the scrapes meanwhile sharing that reading, so a busy /metrics
        (bench/api.py) adds no NVML read per request."""
        page = self.render()
        if self.host is None:
            return page
        now = time.monotonic()
        if self._reading is None or now - self._read_at > GPU_FRESH:
            self._read_at, self._reading = now, asyncio.ensure_future(self.host())
        facts = await asyncio.shield(self._reading)
        return page + _gpus(facts.gpus) if facts.gpus else page

    def render(self) -> bytes:
        """The exposition for one scrape: the counters and histograms as rendered at their
        last change (every change goes through a method below, which marks them changed:
        a scrape never gets a stale value, and a scrape with nothing new renders nothing
        again), then the lanes' present state, read fresh."""
        for lane in self.source.statuses if self.source is not None else ():
            self._zeros(lane)
        if self._rendered is None or self._changed:
            self._changed = False
            self._rendered = generate_latest(self.registry)
        present = b"" if self.source is None else render_present(self.source)
        return self._rendered + present + (b"" if self.budget is None else _budget(self.budget))

    def _zeros(self, lane: str) -> None:
        """The lane's counters of things that may never happen, at 0 until they do: a
        series that is absent looks like a broken scrape on a dashboard and in a rate()
        (Prometheus' instrumentation practice: initialise the label values known ahead)."""
        if lane in self._zeroed:
            return
        self._zeroed.add(lane)
        self._changed = True
        for kind in RestartKind:
            self.restarts.labels(lane, kind.value)
        for seen_by in ("exit", "health", "stalled", "start-timeout", "memory-guard", "weights"):
            self.failures.labels(lane, seen_by)
        for each in (self.probe_failures, self.stalls, self.preflight_refusals):
            each.labels(lane)
        for histogram in (self.proxy_wait_seconds, self.proxy_overhead_seconds):
            histogram.labels(lane)  # so that a first observation is an increase to rate()
        for cause in ("empty", "fits", "idle", "residency", "fifo", "idle_return"):
            self.schedule_swaps.labels(lane, cause)

    def exit(self, lane: str, code: int | None, signal: int | None, verdict: str) -> None:
        self._changed = True
        label = (
            f"signal-{signal}" if signal is not None else "unknown" if code is None else str(code)
        )
        self.exits.labels(lane, label, verdict).inc()

    def restart(self, lane: str, reason: str) -> None:
        self._changed = True
        self.restarts.labels(lane, reason).inc()

    def failure(self, lane: str, seen_by: str) -> None:
        self._changed = True
        self.failures.labels(lane, seen_by).inc()

    def probe_failure(self, lane: str) -> None:
        self._changed = True
        self.probe_failures.labels(lane).inc()

    def stall(self, lane: str) -> None:
        self._changed = True
        self.stalls.labels(lane).inc()

    def swap(self, from_lane: str, to_lane: str, result: str, seconds: float) -> None:
        self._changed = True
        self.swaps.labels(from_lane, to_lane, result).inc()
        if result == "ready":
            self.swap_seconds.labels(from_lane, to_lane).observe(seconds)

    def cold_start(self, lane: str, seconds: float) -> None:
        self._changed = True
        self.cold_start_seconds.labels(lane).observe(seconds)

    def start(self, lane: str, kind: str, seconds: float) -> None:
        self._changed = True
        self.start_seconds.labels(lane, kind).observe(seconds)

    def canary_mismatch(self, lane: str, after: str) -> None:
        self._changed = True
        self.canary_mismatches.labels(lane, after).inc()

    def sleep_mode(self, lane: str, operation: str, seconds: float) -> None:
        self._changed = True
        self.sleep_mode_seconds.labels(lane, operation).observe(seconds)

    def reload(self, result: str) -> None:
        self._changed = True
        self.reloads.labels(result).inc()

    def preflight_refused(self, lane: str) -> None:
        self._changed = True
        self.preflight_refusals.labels(lane).inc()

    def proxy_answer(self, lane: str, code: int) -> None:
        self._changed = True
        self.proxy_answers.labels(lane, str(code)).inc()

    def schedule_swap(self, lane: str, cause: str) -> None:
        self._changed = True
        self.schedule_swaps.labels(lane, cause).inc()

    def proxy_queue_wait(self, lane: str, seconds: float) -> None:
        self._changed = True
        self.proxy_wait_seconds.labels(lane).observe(seconds)

    def proxy_overhead(self, lane: str, seconds: float) -> None:
        self._changed = True
        self.proxy_overhead_seconds.labels(lane).observe(seconds)

    def gpu_gate(self, lane: str, released: bool, seconds: float) -> None:
        self._changed = True
        self.gate_seconds.labels(lane, "released" if released else "timeout").observe(seconds)


BUDGET_SERIES = (
    # (name, type, help, what of the budget)
    (
        "laned_request_memory_bytes",
        "gauge",
        "Memory held for requests in flight: their bodies and the copies made on the way to "
        "the engine.",
        "held",
    ),
    (
        "laned_request_memory_limit_bytes",
        "gauge",
        "The budget of memory for requests in flight (daemon.limits.request_memory_mib).",
        "capacity",
    ),
    (
        "laned_request_memory_waiting",
        "gauge",
        "Requests waiting for room in the budget, their bodies unread.",
        "waiting",
    ),
    (
        "laned_request_memory_refusals_total",
        "counter",
        "Requests answered 503 for want of room in the budget.",
        "refused",
    ),
)


GPU_FRESH = 1.0  # seconds a reading of the GPUs serves the scrapes that follow it

GPU_SERIES = (
    (
        "laned_gpu_memory_total_bytes",
        "The GPU's memory; on a unified GPU, the pool it shares with the host.",
    ),
    (
        "laned_gpu_memory_used_bytes",
        "What is taken of it; on a unified GPU, by every process of the host.",
    ),
)


def _gpus(readings: tuple[GpuReading, ...]) -> bytes:
    """Each GPU's memory as read at this scrape, labelled unified="true" where it is the
    host's pool (docs/placement.md, "Unified memory")."""
    lines = []
    for (name, text), what in zip(GPU_SERIES, ("total_bytes", "used_bytes"), strict=True):
        lines += [f"# HELP {name} {text}", f"# TYPE {name} gauge"]
        for g in readings:
            labels = f'gpu="{g.index}",name="{_label(g.name)}",unified="{str(g.unified).lower()}"'
            lines.append(f"{name}{{{labels}}} {_value(getattr(g, what))}")
    return ("\n".join(lines) + "\n").encode()


def _budget(budget: Budget) -> bytes:
    """The request memory budget as it is now (laned.api.budget), read at each scrape."""
    now = {
        "held": budget.held,
        "capacity": budget.capacity,
        "waiting": budget.waiting(),
        "refused": budget.refused,
    }
    lines = []
    for name, kind, text, what in BUDGET_SERIES:
        family = name.removesuffix("_total")
        lines += [f"# HELP {family} {text}", f"# TYPE {family} {kind}", f"{name} {now[what]}"]
    return ("\n".join(lines) + "\n").encode()
