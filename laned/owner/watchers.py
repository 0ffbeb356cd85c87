"""Watchers: readiness, liveness (health, stall, memory floor) and startup phases.

A watcher probes and reads, and reports what it saw to the owner as an observation; it
never changes a lane's state. The owner answers each report with whether to go on watching
(False once the run it watches is over or no longer serving).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from laned.config.model import LaneConfig, gpu_indices
from laned.core.facts import GIB
from laned.core.liveness import UNANSWERED, EngineSample, MemoryFloor, StallDetector
from laned.core.phases import Seen
from laned.core.unified import pool_available
from laned.engines import for_lane, headless
from laned.owner.seam import Engines, Gpus, Journal, PageCache


@dataclass(frozen=True)
class Tick:
    """A liveness round begins (the owner may say the run is over)."""


@dataclass(frozen=True)
class Ready:
    """Health answers 200 and /v1/models lists the served model."""

    image_id: str | None = None  # the image a container lane runs


@dataclass(frozen=True)
class StartTimedOut:
    """Not ready within start_timeout."""

    after: float


@dataclass(frozen=True)
class ProbeFailed:
    """One health probe failed; `failures` in a row so far, `limit` allowed."""

    failures: int
    limit: int


@dataclass(frozen=True)
class SaidDead:
    """The engine's health answer says it is dead (its profile's HealthRule): `status`,
    and what the engine means by it."""

    status: int
    why: str


@dataclass(frozen=True)
class Sampled:
    """One scrape of the engine's /metrics."""

    sample: EngineSample
    at: float  # monotonic


@dataclass(frozen=True)
class Stalled:
    """Requests running or waiting and no token moving for `after` seconds, or /metrics
    unanswered that long (`unanswered`: for how long; `sample`: the last one read)."""

    sample: EngineSample | None
    after: float
    unanswered: float = 0.0


@dataclass(frozen=True)
class MemoryLow:
    """The host's MemAvailable stayed below the lane's floor; `unified`: the lane's GPUs
    share the host's memory, and what stayed low is that pool's available memory
    (laned.core.unified: MemAvailable, or a cgroup's limit less its usage where lower)."""

    available_gib: float
    floor_gib: float = 0.0
    for_seconds: float = 0.0
    unified: bool = False


Observation = Tick | Ready | StartTimedOut | ProbeFailed | SaidDead | Sampled | Stalled | MemoryLow
Report = Callable[[Observation], bool]


# A close watch on the port: a connection attempt this often (HTTP once it accepts, at most
# every CLOSE_HTTP), for CLOSE_FOR seconds after a trigger: the engine's last startup lines
# (which journald hands on up to 250 ms late: it coalesces its change notifications), or the
# time the lane's last cold start took, CLOSE_LEAD of it in, no more than CLOSE_LEAD_MAX
# seconds early.
CLOSE_EVERY = 0.01
CLOSE_HTTP = 0.1
CLOSE_FOR = 60.0
CLOSE_LEAD = 0.8
CLOSE_LEAD_MAX = 30.0


# Once the engine logs that it is dying, its health is asked every DYING_EVERY for DYING_LOOK
# seconds: its answer may still be 200 for a moment (vLLM's API server learns of its core's
# death from a monitor thread), and vLLM's own exit comes within 5 s (its watchdog).
DYING_EVERY = 0.2
DYING_LOOK = 6.0


def close_watch_from(expected: float | None) -> float | None:
    """Seconds into a start when the close watch begins, given the last cold start."""
    if expected is None or expected <= 0:
        return None
    return max(expected * CLOSE_LEAD, expected - CLOSE_LEAD_MAX)


async def await_ready(
    engines: Engines,
    spec: LaneConfig,
    poke: asyncio.Event,
    report: Report,
    expected: float | None = None,
) -> bool:
    """Probe until the engine is ready (True) or start_timeout has passed (False, reported;
    a Ready the caller reports, with what it learns about the run).

    Probing backs off over a long cold start (×1.5 from start_interval_min to
    start_interval_max). A close watch (the port every 10 ms) begins when `poke` is set —
    the engine logged that it is about to serve — and when the start has run most of the
    `expected` seconds the last cold start took: journald alone would be up to 250 ms late."""
    if headless(spec):
        # A worker rank serves no API: its unit running is all it shows. Its death (it exits
        # when the head goes away) reaches laned as the unit's exit.
        return True
    started = time.monotonic()
    interval = spec.probe.start_interval_min
    key = engines.api_key(spec)
    planned = close_watch_from(expected)
    close_until, opened = 0.0, False
    while True:
        if await engines.health(spec.port, spec.health_path) == 200:
            models = await engines.models(spec.port, key)
            if models is not None and spec.served_model_name in models:
                return True
        elapsed = time.monotonic() - started
        if elapsed >= spec.start_timeout:
            report(StartTimedOut(spec.start_timeout))
            return False
        if poke.is_set():
            poke.clear()
            close_until = max(close_until, elapsed + CLOSE_FOR)
        if planned is not None and elapsed >= planned:
            close_until, planned = max(close_until, planned + CLOSE_FOR), None
        if elapsed < close_until:
            if opened:  # it takes connections but does not serve yet (or a proxy holds the port)
                await asyncio.sleep(CLOSE_HTTP)
            opened = await _until_accepting(engines, spec.port, CLOSE_HTTP)
            continue
        wait = interval if planned is None else min(interval, planned - elapsed)
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(poke.wait(), wait)
        interval = min(interval * 1.5, spec.probe.start_interval_max)


async def _until_accepting(engines: Engines, port: int, at_most: float) -> bool:
    """Whether the port took a connection within `at_most` seconds (tried every CLOSE_EVERY)."""
    deadline = time.monotonic() + at_most
    while not await engines.accepts(port):
        if time.monotonic() >= deadline:
            return False
        await asyncio.sleep(CLOSE_EVERY)
    return True


async def watch_liveness(
    engines: Engines,
    pages: PageCache,
    spec: LaneConfig,
    report: Report,
    alarm: asyncio.Event | None = None,
    gpus: Gpus | None = None,
) -> None:
    """Every probe.interval, and at once when `alarm` is set (the engine logged that it is
    dying; then every DYING_EVERY for DYING_LOOK): health, then /metrics (stall), then the
    host's memory floor — on unified-memory GPUs (`gpus` read once at the start says so),
    the pool they share with the host. A health answer that the engine's profile says means
    it is dead is reported at once (SaidDead); any other failed answer counts towards
    probe.failures. Returns when the owner says stop, or after reporting a failure that
    ends the run."""
    settings = spec.probe
    floor = MemoryFloor(settings.memory_floor_gib, settings.memory_floor_for)
    unified = settings.memory_floor_gib > 0 and await _pool_free(gpus, spec) is not None
    if headless(spec):
        # A worker rank serves no API to probe; its host's memory is guarded all the same
        # (seed 002: each DGX Spark's pool is its own).
        while settings.memory_floor_gib > 0:
            await asyncio.sleep(settings.interval)
            if not report(Tick()) or await _floor_low(floor, pages, gpus, spec, unified, report):
                return
        return
    rule = for_lane(spec).health
    stall = StallDetector(settings.stall_after)
    failures = 0
    last: EngineSample | None = None  # the last sample /metrics gave
    look_until = 0.0  # probing every DYING_EVERY until then: the engine said it is dying
    while True:
        now = time.monotonic()
        wait = DYING_EVERY if now < look_until else settings.interval
        if alarm is None:
            await asyncio.sleep(wait)
        else:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(alarm.wait(), wait)
            if alarm.is_set():
                alarm.clear()
                look_until = time.monotonic() + DYING_LOOK
        if not report(Tick()):
            return
        status = await engines.health(spec.port, spec.health_path)
        if rule.says_dead(status):
            assert status is not None
            report(SaidDead(status, rule.why))
            return
        if status != 200:
            failures += 1
            if not report(ProbeFailed(failures, settings.failures)):
                return
            continue
        failures = 0
        sample = await engines.sample(spec)
        now = time.monotonic()
        if isinstance(sample, EngineSample):
            last = sample
            if not report(Sampled(sample, now)):
                return
            if stall.observe(sample, now):
                report(Stalled(sample, settings.stall_after))
                return
        elif sample is UNANSWERED:
            if stall.unanswered(now):
                report(Stalled(last, settings.stall_after, stall.unanswered_for(now)))
                return
        else:
            stall.answered()
        if settings.memory_floor_gib > 0 and await _floor_low(
            floor, pages, gpus, spec, unified, report
        ):
            return


async def _floor_low(
    floor: MemoryFloor,
    pages: PageCache,
    gpus: Gpus | None,
    spec: LaneConfig,
    unified: bool,
    report: Report,
) -> bool:
    """One reading of the memory the guard watches (the unified pool, else MemAvailable):
    True, once reported, when it has stayed below the floor long enough."""
    free = await _pool_free(gpus, spec) if unified else pages.mem_available()
    available = None if free is None else free / GIB
    if not floor.observe(available, time.monotonic()) or available is None:
        return False
    report(MemoryLow(available, floor.floor_gib, floor.for_seconds, unified))
    return True


async def _pool_free(gpus: Gpus | None, spec: LaneConfig) -> float | None:
    """What is available of the unified memory pool the lane's GPUs share with the host;
    None where they are not unified (or not read)."""
    if gpus is None or gpus.unread() is not None:
        return None
    return pool_available(await asyncio.to_thread(gpus.read, gpu_indices(spec)))


async def follow_phases(
    journal: Journal,
    units: Callable[[], Mapping[str, str]],
    reader: Callable[[str], Callable[[str], Seen | None]],
    report: Callable[[str, Seen, float], None],
    since: float | None = None,
    opened: Callable[[], None] | None = None,
) -> None:
    """Report (unit, what it says, when it was logged) for every startup line of the lane
    units' logs from `since` (default: now), each read by its unit's engine (`reader`);
    JournalUnavailable when they cannot be read."""
    async for unit, line, at in journal.follow(units(), since, opened):
        seen = reader(unit)(line)
        if seen is not None:
            report(unit, seen, at)
