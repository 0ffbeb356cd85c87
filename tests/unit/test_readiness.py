"""The readiness watch: a close watch on the port near the end of a cold start, so that
`ready` follows the port's opening by milliseconds, not by journald's 250 ms coalescing or
the probe's backoff (laned.owner.watchers.await_ready, with a scripted probe: no I/O)."""

from __future__ import annotations

import asyncio
import time

from laned.config.model import LaneConfig
from laned.owner import watchers
from laned.validation.load import parse_config

LANE = (
    '[lanes.a]\nunit = "a.service"\nport = 8000\nserved_model_name = "a"\n'
    'probe = {{ start_interval_min = "{interval}", start_interval_max = "{interval}" }}\n'
    '[lanes.a.exec]\ncommand = ["vllm", "serve", "/m"]\n'
)


def lane(interval: str = "5s") -> LaneConfig:
    config = parse_config(LANE.format(interval=interval), "t.toml", {"HOME": "/home/op"})
    return config.lanes["a"]


class Engine:
    """A probe of an engine whose port accepts from `opens` (monotonic) and which serves from
    `serves`; it counts the HTTP probes."""

    def __init__(self, opens: float, serves: float | None = None) -> None:
        self.opens, self.serves = opens, opens if serves is None else serves
        self.http = 0

    def api_key(self, spec: LaneConfig) -> str | None:
        return None

    async def accepts(self, port: int) -> bool:
        return time.monotonic() >= self.opens

    async def health(self, port: int, path: str = "/health") -> int | None:
        self.http += 1
        return 200 if time.monotonic() >= self.serves else None

    async def models(self, port: int, api_key: str | None) -> list[str] | None:
        return ["a"] if time.monotonic() >= self.serves else None


def ready_after(
    engine: Engine, spec: LaneConfig, expected: float | None, poke_at: float | None = None
) -> float:
    """Seconds from the port's opening to await_ready's return."""

    async def run() -> float:
        poke = asyncio.Event()
        if poke_at is not None:
            asyncio.get_running_loop().call_later(poke_at, poke.set)
        assert await watchers.await_ready(engine, spec, poke, lambda seen: True, expected)  # type: ignore[arg-type]
        return time.monotonic() - engine.opens

    return asyncio.run(run())


def test_the_close_watch_begins_late_in_the_last_cold_start_and_at_most_30s_early() -> None:
    assert watchers.close_watch_from(None) is None
    assert watchers.close_watch_from(0.0) is None
    assert watchers.close_watch_from(2.0) == 1.6
    assert watchers.close_watch_from(1200.0) == 1170.0


def test_a_port_opening_near_the_last_cold_start_is_seen_at_once() -> None:
    # Probing every 5 s (deep in a long cold start); the last start took 1 s; the port opens
    # at 0.9 s. Without the close watch the next probe would come at 5 s.
    lag = ready_after(Engine(time.monotonic() + 0.9), lane("5s"), expected=1.0)
    assert (
        lag < 2.5
    )  # about 10 ms; without the close watch, about 4 s (half: a busy machine's slack)


def test_the_engine_log_line_starts_a_close_watch_without_a_known_cold_start() -> None:
    # The poke (the engine logged its API server's start) comes before the port opens.
    lag = ready_after(Engine(time.monotonic() + 0.6), lane("5s"), expected=None, poke_at=0.3)
    assert lag < 2.5  # as above


def test_a_port_taken_before_the_engine_serves_is_probed_10_times_a_second() -> None:
    # A proxy (rootless podman's port forwarder) holds the port from the start: connections
    # are taken at once, /health fails until the engine serves 0.8 s later.
    now = time.monotonic()
    engine = Engine(opens=now, serves=now + 0.8)
    ready_after(engine, lane("5s"), expected=0.01)
    assert engine.http <= 12  # ~0.8 s / 0.1 s, not one probe per 10 ms
