"""Requests for several lanes of one group at laned's OpenAI endpoint, scheduled
(laned.core.schedule, laned.owner.scheduler), against real lanes on the user manager: a
request waits for its lane's turn instead of a 503, a busy lane keeps the GPUs until it has
paid for its swap, a pinned lane stays, an operator's deactivate answers the waiters, and an
idle group returns to its default lane."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import httpx

from tests.helpers import free_port
from tests.integration.conftest import Harness, Units
from tests.integration.lanes import FAST, lane_config
from tests.integration.test_api import api_server
from tests.integration.test_drain import Stream, reasons
from tests.integration.test_proxy import ask
from tests.integration.test_supervisor import run, until

SLOW = {"LANED_SIM_DECODE_TPS": "25"}  # 200 tokens: 8 s


def test_a_busy_lane_keeps_the_gpus_until_its_min_residency_then_the_waiters_turn_comes(
    harness: Harness, units: Units, tmp_path: Path
) -> None:
    port, api_port = free_port(), free_port()
    lanes = {"a": FAST + 'on_demand = true\nmin_residency = "3s"\n', "b": FAST + "on_demand = true\n"}  # fmt: skip
    config = lane_config(harness, units, tmp_path, lanes, port, env={"a": SLOW, "b": SLOW})

    async def scenario() -> None:
        async with (
            api_server(harness, config, api_port) as sup,
            httpx.AsyncClient(base_url=f"http://127.0.0.1:{api_port}", timeout=60) as client,
        ):
            await sup.activate("a")
            busy = Stream(client, "a", 200)
            await until(lambda: busy.chunks >= 3, 10, "a's stream to begin")
            waiter = asyncio.ensure_future(client.post("/v1/completions", json=ask("b")))
            await until(lambda: sup.traffic.queued("b") == 1, 10, "b's request to wait")
            view = (await client.get("/lanes/b")).json()["proxy"]
            assert view["queued"] == 1 and view["oldest_wait"] >= 0, view
            assert (
                'laned_requests_oldest_wait_seconds{lane="b"}'
                in (await client.get("/metrics")).text
            )
            answer = await waiter
            assert answer.status_code == 200 and answer.json()["model"] == "b", answer.text
            # a was never idle: the swap came when its residency ended, and a's stream was
            # drained, not cut.
            [swap] = reasons(sup, "b", "schedule")
            assert "a resident" in swap and "past its min residency 3 s" in swap, swap
            await busy.task
            assert busy.status == 200 and busy.done, "a's stream was cut"
            # Back to a: b idle (its measured cold start is its residency; a tenth, idle).
            back = await client.post("/v1/completions", json=ask("a"))
            assert back.status_code == 200, back.text
            [home] = reasons(sup, "a", "schedule")
            assert "; b idle " in home, home
            text = (await client.get("/metrics")).text
            assert 'laned_schedule_swaps_total{cause="residency",lane="b"} 1.0' in text
            assert 'laned_schedule_swaps_total{cause="idle",lane="a"} 1.0' in text

    run(scenario())


def test_a_pinned_lane_stays_and_an_operators_deactivate_answers_the_waiters(
    harness: Harness, units: Units, tmp_path: Path
) -> None:
    port, api_port = free_port(), free_port()
    lanes = {
        "a": FAST + "pinned = true\n",
        "b": FAST + 'on_demand = true\nmin_residency = "10m"\n',
        "c": FAST + "on_demand = true\n",
    }
    config = lane_config(harness, units, tmp_path, lanes, port, env={"b": SLOW})

    async def scenario() -> None:
        async with (
            api_server(harness, config, api_port) as sup,
            httpx.AsyncClient(base_url=f"http://127.0.0.1:{api_port}", timeout=60) as client,
        ):
            await sup.activate("a")
            refused = await client.post("/v1/completions", json=ask("b"))
            assert refused.status_code == 503, refused.text
            assert "a is pinned in its group" in refused.json()["error"]["message"]
            assert sup.statuses["a"].state.value == "ready" and not reasons(sup, "b", "schedule")
            # b resident and busy for 10 minutes of residency: a request for c waits, and
            # the operator's deactivate of c answers it at once.
            await sup.activate("b")
            busy = Stream(client, "b", 200)
            await until(lambda: busy.chunks >= 3, 10, "b's stream to begin")
            waiter = asyncio.ensure_future(client.post("/v1/completions", json=ask("c")))
            await until(lambda: sup.traffic.queued("c") == 1, 10, "c's request to wait")
            await sup.deactivate("c")
            answer = await waiter
            assert answer.status_code == 503, answer.text
            assert "deactivated by an operator" in answer.json()["error"]["message"]
            assert sup.statuses["b"].state.value == "ready" and not reasons(sup, "c", "schedule")
            busy.task.cancel()

    run(scenario())


def test_an_idle_group_returns_to_its_default_lane(
    harness: Harness, units: Units, tmp_path: Path
) -> None:
    port, api_port = free_port(), free_port()
    lanes = {"a": FAST, "b": FAST + "on_demand = true\n"}
    daemon = 'default_lane = "a"\nidle_return = "2s"\n'
    config = lane_config(harness, units, tmp_path, lanes, port, daemon=daemon)

    async def scenario() -> None:
        async with (
            api_server(harness, config, api_port) as sup,
            httpx.AsyncClient(base_url=f"http://127.0.0.1:{api_port}", timeout=60) as client,
        ):
            await until(lambda: sup.statuses["a"].state.value == "ready", 20, "a at boot")
            answer = await client.post("/v1/completions", json=ask("b"))
            assert answer.status_code == 200, answer.text
            await until(lambda: sup.statuses["a"].state.value == "ready", 20, "a again")
            [back] = reasons(sup, "a", "schedule")
            assert back.startswith("back to the default lane a: no request for ") and "idle_return 2 s" in back, back  # fmt: skip
            assert sup.statuses["b"].state.value == "inactive"

    run(scenario())


def test_a_streaming_chat_request_that_waits_hears_the_lanes_progress_in_band(
    harness: Harness, units: Units, tmp_path: Path
) -> None:
    port, api_port = free_port(), free_port()
    lanes = {"a": FAST, "b": FAST + "on_demand = true\nloading_state = true\n"}
    config = lane_config(harness, units, tmp_path, lanes, port, env={"b": {"LANED_SIM_STARTUP": "3"}})  # fmt: skip
    chat = {"model": "b", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 5, "stream": True}  # fmt: skip

    async def scenario() -> None:
        async with (
            api_server(harness, config, api_port) as sup,
            httpx.AsyncClient(base_url=f"http://127.0.0.1:{api_port}", timeout=60) as client,
        ):
            await sup.activate("a")
            events = []
            async with client.stream("POST", "/v1/chat/completions", json=chat) as sse:
                assert sse.status_code == 200 and sse.headers["content-type"].startswith("text/event-stream")  # fmt: skip
                async for line in sse.aiter_lines():
                    if line.startswith("data: "):
                        events.append(line[6:])
            assert events[-1] == "[DONE]"
            chunks = [json.loads(e) for e in events[:-1]]
            told = [c["choices"][0]["delta"].get("reasoning") for c in chunks if c["id"].startswith("chatcmpl-laned-")]  # fmt: skip
            assert told and all(t.startswith("b: ") for t in told), told
            assert any("starting" in t or "waiting for its turn" in t for t in told), told
            # Then the engine's own stream, unchanged: its chunks, its text.
            engine = [c for c in chunks if not c["id"].startswith("chatcmpl-laned-")]
            text = "".join(c["choices"][0]["delta"].get("content") or "" for c in engine if c["choices"])  # fmt: skip
            assert engine and text, chunks
            assert sup.statuses["b"].state.value == "ready"
            # Ready now: no wait, no in-band line.
            plain = await client.post("/v1/chat/completions", json=chat)
            assert "chatcmpl-laned-" not in plain.text and plain.text.rstrip().endswith("[DONE]")

    run(scenario())


def test_a_lane_whose_acceptance_checks_run_is_busy_not_idle(
    harness: Harness, units: Units, tmp_path: Path
) -> None:
    """A request for b that arrives as a becomes ready waits for a's checks after activation
    (their requests do not go through laned's endpoint, yet they are a's work): swapped away
    mid-check, their results would be lost."""
    port, api_port = free_port(), free_port()
    lanes = {
        "a": FAST + 'on_demand = true\nmin_residency = "30s"\nchecks = { after_activate = ["chat", "speed"], speed_min_tps = 1 }\n',
        "b": FAST + "on_demand = true\n",
    }  # fmt: skip
    # Checks of ~5 s (the speed gate decodes 400 tokens): long enough to be under way
    # when the request for b comes, short enough not to be the test's time.
    config = lane_config(harness, units, tmp_path, lanes, port, env={"a": {"LANED_SIM_DECODE_TPS": "100"}})  # fmt: skip

    async def scenario() -> None:
        async with (
            api_server(harness, config, api_port) as sup,
            httpx.AsyncClient(base_url=f"http://127.0.0.1:{api_port}", timeout=60) as client,
        ):
            await sup.activate("a")
            answer = await client.post("/v1/completions", json=ask("b"))
            assert answer.status_code == 200, answer.text
            checks = reasons(sup, "a", "check")
            assert not [c for c in checks if "did not run" in c], checks
            assert any(c.startswith("speed passed") for c in checks), checks
            assert sup.statuses["a"].checks is not None  # kept: they ran to their end
            [swap] = reasons(sup, "b", "schedule")
            assert "; a idle " in swap, swap  # once its checks ended

    run(scenario())
