"""Draining and activation on demand at laned's OpenAI endpoint, against real lanes.

A swap never cuts a request that runs through laned: the old lane gets no new request, the
ones in flight finish, then it stops. `force` cuts them, and the events say so.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import httpx

from laned.owner.supervisor import Supervisor
from tests.helpers import free_port
from tests.integration.conftest import Harness, Units
from tests.integration.lanes import FAST, lane_config
from tests.integration.test_api import api_server
from tests.integration.test_proxy import ask
from tests.integration.test_supervisor import run, until


def reasons(sup: Supervisor, lane: str, kind: str) -> list[str]:
    return [e.reason for e in sup.events if e.lane == lane and e.kind.value == kind]


class Stream:
    """A streaming completion through laned's endpoint, read to its end in a task."""

    def __init__(self, client: httpx.AsyncClient, model: str, tokens: int) -> None:
        self.ask = {
            "model": model, "prompt": "hi", "max_tokens": tokens, "ignore_eos": True,
            "stream": True, "stream_options": {"include_usage": True},
        }  # fmt: skip
        self.client = client
        self.chunks = 0
        self.done = False  # `data: [DONE]` seen
        self.usage: dict[str, Any] | None = None
        self.error: BaseException | None = None
        self.status = 0
        self.task = asyncio.create_task(self._read())

    async def _read(self) -> None:
        try:
            async with self.client.stream("POST", "/v1/completions", json=self.ask) as sse:
                self.status = sse.status_code
                async for line in sse.aiter_lines():
                    if line == "data: [DONE]":
                        self.done = True
                    elif line.startswith("data: "):
                        data = json.loads(line[6:])
                        self.chunks += 1
                        self.usage = data.get("usage") or self.usage
        except httpx.HTTPError as exc:
            self.error = exc


def test_a_swap_waits_for_requests_in_flight_and_force_cuts_them(
    harness: Harness, units: Units, tmp_path: Path
) -> None:
    port, api_port = free_port(), free_port()
    slow = {"LANED_SIM_DECODE_TPS": "25"}
    lanes = {"a": FAST, "b": FAST + 'drain_timeout = "600ms"\n', "c": FAST}
    config = lane_config(harness, units, tmp_path, lanes, port, env={"a": slow, "b": slow, "c": slow})  # fmt: skip

    async def scenario() -> None:
        async with (
            api_server(harness, config, api_port) as sup,
            httpx.AsyncClient(base_url=f"http://127.0.0.1:{api_port}", timeout=60) as client,
        ):
            await sup.activate("a")
            # 1. A stream runs (50 tokens at 25/s: 2 s) when the swap to b is asked.
            running = Stream(client, "a", 50)
            await until(lambda: running.chunks >= 3, 10, "the stream to begin")
            swap = sup.activate("b")
            await until(lambda: sup.statuses["a"].state.value == "stopping", 5, "a stopping")
            view = (await client.get("/lanes/a")).json()
            assert view["proxy"]["in_flight"] == 1, view["proxy"]
            # A new request for the lane that drains is not sent to it.
            late = await client.post("/v1/completions", json={"model": "a", "prompt": "x", "max_tokens": 2})  # fmt: skip
            assert late.status_code == 503 and late.json()["error"]["laned"]["state"] == "stopping"
            assert not swap.done(), "the swap must wait for the stream"
            await swap
            await running.task
            assert running.error is None and running.status == 200
            assert running.done and running.usage is not None, "the stream was cut"
            assert running.usage["completion_tokens"] == 50
            drain = reasons(sup, "a", "drain")
            assert drain[0].startswith("draining 1 request(s)"), drain
            assert drain[-1].startswith("drained 1 request(s)"), drain
            # The stream ended before the unit was stopped: its stop came after the drain.
            text = (await client.get("/metrics")).text
            assert 'laned_proxy_requests_total{code="200",lane="a"}' in text
            assert 'laned_proxy_requests_total{code="503",lane="a"}' in text
            assert 'laned_requests_in_flight{lane="a"} 0.0' in text

            # 2. force: the stream on b is cut at once, and the event says so.
            cut = Stream(client, "b", 200)
            await until(lambda: cut.chunks >= 3, 10, "the stream on b to begin")
            await (await front_activate(client, "c", force=True))
            await cut.task
            assert not cut.done and cut.chunks < 200
            assert any(
                r.startswith("force: cutting 1 request(s)") for r in reasons(sup, "b", "drain")
            )

            # 3. drain_timeout: b waits 600 ms at most, then cuts.
            await sup.activate("b")
            long = Stream(client, "b", 200)  # 8 s of tokens
            await until(lambda: long.chunks >= 3, 10, "the long stream to begin")
            await sup.deactivate("b")
            await long.task
            assert not long.done
            assert reasons(sup, "b", "drain")[-1].startswith(
                "drain_timeout 0.6 s passed: cutting 1"
            )

    run(scenario())


async def front_activate(client: httpx.AsyncClient, lane: str, force: bool) -> Any:
    """Activate through the API (as an operator would), returning an awaitable for ready."""
    reply = await client.post(f"/lanes/{lane}/activate", params={"force": str(force).lower()})
    assert reply.status_code == 202, reply.text

    async def ready() -> None:
        answer = await client.post(f"/lanes/{lane}/activate", params={"wait": "true"})
        assert answer.status_code == 200, answer.text

    return ready()


def test_a_request_activates_an_on_demand_lane_and_only_that(
    harness: Harness, units: Units, tmp_path: Path
) -> None:
    port, api_port = free_port(), free_port()
    lanes = {
        "a": FAST,  # on_demand off (the default)
        "b": FAST + "on_demand = true\n",
        "c": FAST + 'on_demand = true\ngroup = "c"\ngpus = []\nstart_limit_burst = 1\n',
    }
    env = {"b": {"LANED_SIM_STARTUP": "1"}, "c": {"LANED_SIM_FAIL_AT_START": "3"}}
    daemon = f'listen = "127.0.0.1:{api_port}"\n'  # the hints name it, not :9000
    config = lane_config(harness, units, tmp_path, lanes, port, daemon, env, {"c": free_port()})

    async def scenario() -> None:
        async with (
            api_server(harness, config, api_port) as sup,
            httpx.AsyncClient(base_url=f"http://127.0.0.1:{api_port}", timeout=60) as client,
        ):
            await sup.activate("a")
            # Three requests for b at once: one swap, and all three are answered by b.
            answers = await asyncio.gather(
                *(client.post("/v1/completions", json=ask("b")) for _ in range(3))
            )
            assert [r.status_code for r in answers] == [200] * 3, answers[0].text
            assert all(r.json()["model"] == "b" for r in answers)
            # One decision, with its reason, and the swap it made (laned.core.schedule).
            [swap] = reasons(sup, "b", "schedule")
            assert swap.startswith("swap to b: ") and "; a idle " in swap, swap
            assert swap in reasons(sup, "b", "transition")
            assert sup.statuses["a"].state.value == "inactive"
            # a says on_demand = false: a request for it evicts nobody.
            refused = await client.post("/v1/completions", json=ask("a"))
            assert refused.status_code == 503 and int(refused.headers["retry-after"]) > 0
            assert "on_demand is off" in refused.json()["error"]["message"]
            hint = refused.json()["error"]["laned"]["hint"]
            assert hint == f"activate it: curl -s localhost:{api_port}/lanes/a/activate", hint
            assert sup.statuses["b"].state.value == "ready"
            listed = {m["id"]: m["laned"]["on_demand"] for m in (await client.get("/v1/models")).json()["data"]}  # fmt: skip
            assert listed == {"a": False, "b": True, "c": True}
            # c crashes at start: its waiting request hears why; the failed lane is not
            # started again by the next request.
            failed = await client.post("/v1/completions", json=ask("c"))
            assert failed.status_code == 503 and "crash-loop" in failed.text, failed.text
            again = await client.post("/v1/completions", json=ask("c"))
            assert again.status_code == 503 and "does not start a failed lane" in again.text

    run(scenario())
