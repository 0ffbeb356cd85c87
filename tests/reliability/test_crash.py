"""laned killed (SIGKILL) at random moments of swaps — while it stops the old lane, at the gate,
during the new lane's cold start — and started again: each time it comes back to the last
request it accepted, state.json is whole, and two lanes of the group never run together. An
unreadable state.json at start is reported with its path, kept aside, and what runs is
adopted: nothing is started twice."""

from __future__ import annotations

import functools
import json
import random
import threading
import time
from typing import Any

import httpx

from bench.common import LanedServe
from tests.helpers import wait_until
from tests.integration.conftest import Harness
from tests.reliability.conftest import Sampler, figures, unit_property

KILLS = 20


def views(url: str) -> dict[str, dict[str, Any]] | None:
    try:
        lanes = httpx.get(f"{url}/lanes", timeout=10).json()["lanes"]
    except httpx.HTTPError:
        return None
    return {v["name"]: v for v in lanes}


def in_flight(url: str, lane: str) -> int:
    view = httpx.get(f"{url}/lanes/{lane}", timeout=10).json()
    return int((view.get("proxy") or {}).get("in_flight", 0))


def stopping(url: str, lane: str) -> bool:
    return (views(url) or {}).get(lane, {}).get("state") == "stopping"


def converged(url: str, wanted: str, other: str) -> bool:
    lanes = views(url)
    return bool(lanes) and lanes[wanted]["state"] == "ready" and lanes[other]["state"] == "inactive"  # type: ignore[index]


class Crashes:
    """laned killed and started again on the same config, while a Sampler reads the group's
    units; at the end the sampler stops and the last laned with it."""

    def __init__(self, harness: Harness, serve: LanedServe) -> None:
        self.harness, self.first = harness, serve
        self.current = serve
        self.sampler = Sampler(harness, {"g": list(serve.units)})

    def __enter__(self) -> Crashes:
        self.sampler.start()
        return self

    def kill(self) -> None:
        self.current.kill()

    def start_again(self) -> LanedServe:
        old = self.current
        self.current = LanedServe(old.path, old.api, self.harness.env, old.units).__enter__()
        return self.current

    def __exit__(self, *exc: object) -> None:
        self.sampler.done = True
        self.sampler.join()
        if self.current is not self.first:
            self.current.__exit__()


def test_laned_killed_in_swaps_comes_back_to_the_last_accepted_request(
    harness: Harness, swap_pair: Any
) -> None:
    serve = swap_pair()
    rng = random.Random(18)
    state_file = serve.path.parent / "state" / "state.json"
    took, delays = [], []
    with Crashes(harness, serve) as crashes:
        wanted = "a"
        for _ in range(KILLS):
            wanted, other = ("b", "a") if wanted == "a" else ("a", "b")
            url = crashes.current.url
            assert httpx.post(f"{url}/lanes/{wanted}/activate", timeout=30).status_code == 202
            delay = rng.uniform(0, 1.2)  # stop, gate, start job, cold start (0.3 s), probing
            delays.append(delay)
            time.sleep(delay)
            crashes.kill()
            json.loads(state_file.read_text())  # whole: written atomically
            started = time.monotonic()
            back = functools.partial(converged, crashes.start_again().url, wanted, other)
            wait_until(back, 60, f"laned back with {wanted} ready")
            took.append(time.monotonic() - started)
    sampler = crashes.sampler
    assert sampler.overlaps == 0
    figures("kill-during-swaps", kills=KILLS, converged_to_last_request=len(took), state_json_corrupt=0,
            sampler_samples=sampler.samples, overlaps=sampler.overlaps,
            kill_delay_s=[round(min(delays), 2), round(max(delays), 2)],
            back_s_max=round(max(took), 2))  # fmt: skip


DRAIN_KILLS = 5


def test_laned_killed_while_it_drains_a_swap_comes_back_to_the_last_accepted_request(
    harness: Harness, swap_pair: Any
) -> None:
    """A request streams from the old lane when the swap begins: laned waits for it before it
    stops the lane (the drain), and is killed then. The request is cut with laned (it was its
    proxy); the restarted laned still swaps to the lane asked for."""
    serve = swap_pair()
    cut, wanted = 0, "a"
    # ignore_eos: all 400 tokens (8 s at 50 tokens/s); "hello" alone is answered in 12.
    body = {"prompt": "hello", "max_tokens": 400, "ignore_eos": True, "stream": True}
    with Crashes(harness, serve) as crashes:
        for _ in range(DRAIN_KILLS):
            old, url = wanted, crashes.current.url
            wanted = "b" if wanted == "a" else "a"

            def stream(url: str = url, model: str = old) -> None:
                nonlocal cut
                try:
                    with httpx.stream(
                        "POST", f"{url}/v1/completions", json={**body, "model": model}, timeout=30
                    ) as reply:
                        for _chunk in reply.iter_bytes():
                            pass
                except httpx.HTTPError:
                    cut += 1

            reader = threading.Thread(target=stream)
            reader.start()
            wait_until(functools.partial(in_flight, url, old), 20, "a request in flight")
            assert httpx.post(f"{url}/lanes/{wanted}/activate", timeout=30).status_code == 202
            wait_until(functools.partial(stopping, url, old), 20, f"{old} draining")
            assert in_flight(url, old) >= 1  # still draining when killed
            crashes.kill()
            reader.join(30)
            back = functools.partial(converged, crashes.start_again().url, wanted, old)
            wait_until(back, 60, f"{wanted} ready")
    sampler = crashes.sampler
    assert sampler.overlaps == 0
    figures("kill-during-drains", kills=DRAIN_KILLS, converged_to_last_request=DRAIN_KILLS,
            requests_cut_with_laned=cut, sampler_samples=sampler.samples,
            overlaps=sampler.overlaps)  # fmt: skip


def test_an_unreadable_state_file_is_reported_kept_and_what_runs_adopted(
    harness: Harness, swap_pair: Any
) -> None:
    serve = swap_pair()
    unit_a = next(u for u in serve.units if u.endswith("-a.service"))
    pid = unit_property(harness, "MainPID", unit_a)
    serve.kill()
    state_file = serve.path.parent / "state" / "state.json"
    state_file.write_text('{"version": 1, "desired": {"a": "act')  # cut short mid-write
    again = LanedServe(serve.path, serve.api, harness.env, serve.units, ready=1)
    again.__enter__()
    try:
        notices = httpx.get(f"{again.url}/healthz", timeout=10).json()["notices"]
        assert len(notices) == 1 and str(state_file) in notices[0] and "unreadable" in notices[0]
        assert (state_file.parent / "state.json.unreadable").exists()
        lanes = views(again.url)
        assert (
            lanes is not None
            and lanes["a"]["state"] == "ready"
            and lanes["b"]["state"] == "inactive"
        )
        assert unit_property(harness, "MainPID", unit_a) == pid  # adopted, not started again
        log = (serve.path.parent / "laned.log").read_text()
        assert str(state_file) in log
    finally:
        again.__exit__()
    figures("unreadable-state", reported=1, kept_aside=1, engine_restarted=0, lanes_started=0)
