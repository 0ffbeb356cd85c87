"""Storms: 200 concurrent activate/deactivate calls over lanes of two groups, and requests at
laned's OpenAI endpoint through a swap; every call answered, no 5xx, never two lanes of a
group running at once (a sampler reads systemd every 20 ms), the final state the last request."""

from __future__ import annotations

import asyncio
import random
import time
from typing import Any

import httpx

from tests.helpers import free_port, wait_until
from tests.integration.conftest import Harness
from tests.integration.lanes import FAST
from tests.reliability.conftest import Sampler, figures


def settled(url: str) -> list[dict[str, Any]] | None:
    lanes = httpx.get(f"{url}/lanes", timeout=10).json()["lanes"]
    busy = [v for v in lanes if v["state"] not in ("ready", "inactive")]
    return None if busy else lanes


def test_200_concurrent_calls_over_two_groups(harness: Harness, daemon: Any) -> None:
    lanes = {
        # No GPU each: the groups alone keep lanes apart (laned.core.placement).
        "a1": 'group = "g1"\ngpus = []\n',
        "b1": 'group = "g1"\ngpus = []\n',
        "a2": 'group = "g2"\ngpus = []\n',
        "b2": 'group = "g2"\ngpus = []\n',
    }
    ports = {"a1": (p1 := free_port()), "b1": p1, "a2": (p2 := free_port()), "b2": p2}
    serve = daemon({n: FAST + extra for n, extra in lanes.items()}, ready=0, ports=ports)
    groups = {
        g: [u for u in serve.units if u.endswith((f"-a{g[1]}.service", f"-b{g[1]}.service"))]
        for g in ("g1", "g2")
    }
    sampler = Sampler(harness, groups)
    sampler.start()
    rng = random.Random(17)
    calls = [
        (rng.choice(list(lanes)), rng.choice(["activate", "deactivate"]), rng.random() < 0.5)
        for _ in range(200)
    ]

    async def storm() -> list[int]:
        async with httpx.AsyncClient(base_url=serve.url, timeout=120) as client:

            async def one(lane: str, verb: str, wait: bool) -> int:
                params = {"wait": "true", "timeout": "60"} if wait else {}
                return (await client.post(f"/lanes/{lane}/{verb}", params=params)).status_code

            return await asyncio.gather(*(one(*c) for c in calls))

    codes = asyncio.run(storm())
    last = {"g1": "b1", "g2": "a2"}
    for lane in last.values():  # the last request of each group, after the storm
        assert (
            httpx.post(
                f"{serve.url}/lanes/{lane}/activate", params={"wait": "true"}, timeout=120
            ).status_code
            == 200
        )
    final = wait_until(lambda: settled(serve.url), 60, "every lane settled")
    sampler.done = True
    sampler.join()
    assert len(codes) == 200 and all(c < 500 for c in codes), sorted(set(codes))
    by_name = {v["name"]: v for v in final}
    for lane in ("a1", "b1", "a2", "b2"):
        wanted = lane in last.values()
        assert by_name[lane]["state"] == ("ready" if wanted else "inactive"), by_name[lane]
        assert by_name[lane]["desired"] == ("active" if wanted else "inactive"), by_name[lane]
    assert sampler.overlaps == 0
    figures("storm-control", calls=len(codes), answered=len(codes), server_errors=0,
            codes=sorted({str(c): codes.count(c) for c in set(codes)}.items()),
            sampler_samples=sampler.samples, overlaps=sampler.overlaps)  # fmt: skip


def in_flight(url: str, lane: str) -> int:
    return int(
        (httpx.get(f"{url}/lanes/{lane}", timeout=10).json().get("proxy") or {}).get("in_flight", 0)
    )


def test_requests_through_a_swap_are_all_answered(swap_pair: Any) -> None:
    """100 requests in flight on `a` when the swap to `b` begins (the swap drains them), 100
    for `b` sent as it begins (they wait for it); then 50 more for `a`, which is gone: those
    are told so (503 with Retry-After), by design. The queue holds 128 here (its default, 64,
    would answer the 65th waiter 503 at once, by design too)."""
    serve = swap_pair("proxy = { queue_limit = 128 }\n")
    body = {"prompt": "hello", "max_tokens": 60, "ignore_eos": True}  # 1.2 s at 50 tokens/s

    async def traffic() -> tuple[list[int], list[httpx.Response]]:
        async with httpx.AsyncClient(
            base_url=serve.url, timeout=120, limits=httpx.Limits(max_connections=300)
        ) as client:

            async def ask(model: str) -> httpx.Response:
                return await client.post("/v1/completions", json={**body, "model": model})

            to_a = [asyncio.ensure_future(ask("a")) for _ in range(100)]
            deadline = time.monotonic() + 30
            while await asyncio.to_thread(in_flight, serve.url, "a") < 100:
                assert time.monotonic() < deadline, "the requests never reached the engine"
                await asyncio.sleep(0.02)
            assert (await client.post("/lanes/b/activate")).status_code == 202
            to_b = [asyncio.ensure_future(ask("b")) for _ in range(100)]  # queued until b is ready
            codes = [r.status_code for r in await asyncio.gather(*to_a, *to_b)]
            ready = await client.post("/lanes/b/activate", params={"wait": "true"})
            assert ready.status_code == 200, ready.text
            late = list(await asyncio.gather(*(ask("a") for _ in range(50))))
            return codes, late

    codes, late = asyncio.run(traffic())
    assert len(codes) == 200 and set(codes) == {200}, {c: codes.count(c) for c in set(codes)}
    assert {r.status_code for r in late} == {503}
    assert all(r.headers.get("retry-after") and "activate" in r.text for r in late)
    figures("storm-proxy", in_flight_at_swap=100, queued_for_new_lane=100, answered_200=codes.count(200),
            for_the_old_lane_after_the_swap=len(late), told_503_with_retry_after=len(late))  # fmt: skip
