"""laned's OpenAI endpoint against two real lanes (simulator engines) in different groups."""

from __future__ import annotations

import asyncio
import logging
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from laned.adapters.probes import parse_engine_metrics
from tests.helpers import free_port
from tests.integration.conftest import Harness, Units
from tests.integration.lanes import FAST, lane_config
from tests.integration.test_api import api_server
from tests.integration.test_supervisor import run, until

KEY = "sk-lane-b-7f3a"


def ask(model: str) -> dict[str, Any]:
    """A short completion request for `model`."""
    return {"model": model, "prompt": "hi", "max_tokens": 3}


def test_one_url_routes_by_model_streams_and_says_why_a_lane_does_not_serve(
    harness: Harness, units: Units, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    port_a, port_b, port_c, api_port = free_port(), free_port(), free_port(), free_port()
    key_file = tmp_path / "b.env"
    key_file.write_text(f"VLLM_API_KEY={KEY}\n")
    key_file.chmod(0o600)
    lanes = {
        # No GPU each (laned.core.placement): the three run together.
        "a": FAST + 'aliases = ["alpha"]\ngpus = []\n',
        "b": FAST + f'group = "other"\ngpus = []\napi_key_file = "{key_file}"\n',
        "c": FAST + 'group = "third"\ngpus = []\n',
    }
    config = lane_config(
        harness, units, tmp_path, lanes, port_a, ports={"b": port_b, "c": port_c},
        env={"b": {"LANED_SIM_DECODE_TPS": "40"}},
    )  # fmt: skip
    base = f"http://127.0.0.1:{api_port}"

    async def scenario() -> None:
        async with (
            api_server(harness, config, api_port) as sup,
            httpx.AsyncClient(base_url=base, timeout=30) as client,
        ):
            await sup.activate("a")
            await sup.activate("b")
            # Routed by model: the engine that answers says whose it is.
            for model, lane in (("a", "a"), ("alpha", "a")):
                reply = await client.post(
                    "/v1/completions", json={"model": model, "prompt": "hi", "max_tokens": 3}
                )
                assert reply.status_code == 200, reply.text
                assert reply.json()["model"] == lane
            # A large body is read by the body parser's worker, and its alias spliced in place.
            large = {"model": "alpha", "prompt": "word " * 30_000, "max_tokens": 3}
            reply = await client.post("/v1/completions", json=large)
            assert reply.status_code == 200, reply.text
            assert reply.json()["model"] == "a"
            # The lane's key travels as the client sends it, and the engine judges it.
            ask = {"model": "b", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 5}
            refused = await client.post("/v1/chat/completions", json=ask)
            assert refused.status_code == 401
            auth = {"Authorization": f"Bearer {KEY}"}
            assert (
                await client.post("/v1/chat/completions", json=ask, headers=auth)
            ).status_code == 200
            # Streaming passes through chunk by chunk, not buffered to the end.
            stream = {**ask, "stream": True, "max_tokens": 40, "ignore_eos": True}
            arrivals: list[float] = []
            async with client.stream(
                "POST", "/v1/chat/completions", json=stream, headers=auth
            ) as sse:
                assert sse.status_code == 200
                assert sse.headers["content-type"].startswith("text/event-stream")
                async for line in sse.aiter_lines():
                    if line.startswith("data: "):
                        arrivals.append(time.monotonic())
            assert len(arrivals) >= 40 and arrivals[-1] - arrivals[0] > 0.5  # 40 tokens at 40/s
            # A model nobody serves, and a lane that does not run.
            unknown = await client.post("/v1/chat/completions", json={**ask, "model": "gpt-4o"})
            assert unknown.status_code == 404
            assert "alpha" in unknown.json()["error"]["message"]
            idle = await client.post("/v1/chat/completions", json={**ask, "model": "c"})
            assert idle.status_code == 503 and int(idle.headers["retry-after"]) >= 1
            error = idle.json()["error"]
            assert (
                error["laned"]["state"] == "inactive"
                and "/lanes/c/activate" in error["laned"]["hint"]
            )
            listed = (await client.get("/v1/models")).json()["data"]
            assert {(m["id"], m["laned"]["state"]) for m in listed} == {
                ("a", "ready"), ("alpha", "ready"), ("b", "ready"), ("c", "inactive"),
            }  # fmt: skip
            # The key is in no event and no metric.
            events = (await client.get("/events", params={"limit": 500})).text
            assert KEY not in events and KEY not in (await client.get("/metrics")).text
            # ... nor in laned's log (every logger, every level) or the engine's journal.
            assert caplog.records and KEY not in caplog.text
            assert KEY not in (await client.get("/lanes/b/logs", params={"lines": 500})).text

    run(scenario())


def test_a_client_that_goes_away_ends_the_engines_request(
    harness: Harness, units: Units, tmp_path: Path
) -> None:
    port, api_port = free_port(), free_port()
    config = lane_config(
        harness, units, tmp_path, {"a": FAST}, port, env={"a": {"LANED_SIM_DECODE_TPS": "20"}}
    )
    ask = {"model": "a", "prompt": "hi", "max_tokens": 400, "ignore_eos": True, "stream": True}

    async def running() -> float:
        async with httpx.AsyncClient() as engine:
            text = (await engine.get(f"http://127.0.0.1:{port}/metrics")).text
        return parse_engine_metrics(text).running

    async def scenario() -> None:
        async with api_server(harness, config, api_port) as sup:
            await sup.activate("a")
            async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{api_port}") as client:
                warm = await client.post("/v1/completions", json={**ask, "stream": False, "max_tokens": 1})  # fmt: skip
                assert warm.status_code == 200
                before = engine_connections(port)
                for _ in range(5):
                    async with client.stream("POST", "/v1/completions", json=ask) as sse:
                        seen = 0
                        async for line in sse.aiter_lines():
                            seen += line.startswith("data: ")
                            if seen == 3:
                                break  # the client goes away mid-answer (20 s of it left)
                    # Closing the stream closed the proxy's connection to the engine: vLLM
                    # (and the simulator) abort a request whose connection goes away.
                    await until_async(running, 0.0, 10)
                # Nothing leaks: no request counted in flight, no connection left open.
                await until(lambda: sup.traffic.in_flight("a") == 0, 5, "in flight back to 0")
                assert (await client.get("/lanes/a")).json()["proxy"] == {"in_flight": 0, "queued": 0, "oldest_wait": 0.0}  # fmt: skip
                await until(lambda: engine_connections(port) <= before, 5, "connections closed")

    run(scenario())


def engine_connections(port: int) -> int:
    """Established TCP connections to 127.0.0.1:port, from the kernel's table."""
    count = 0
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table, encoding="ascii") as rows:
            for row in list(rows)[1:]:
                fields = row.split()
                remote, state = fields[2], fields[3]
                count += state == "01" and int(remote.rsplit(":", 1)[1], 16) == port
    return count


async def until_async(read: Any, value: float, timeout: float) -> None:
    """Wait until an async reading equals `value`, with a deadline."""
    deadline = time.monotonic() + timeout
    while (got := await read()) != value:
        assert time.monotonic() < deadline, f"still {got} after {timeout}s"
        await asyncio.sleep(0.05)


def test_requests_wait_through_a_cold_start_within_their_queue(
    harness: Harness, units: Units, tmp_path: Path
) -> None:
    ports = {n: free_port() for n in "abcd"}
    api_port = free_port()
    lanes = {
        # No GPU each (laned.core.placement): the four run side by side.
        "a": FAST + "gpus = []\n",  # waits, then succeeds
        "b": FAST + 'gpus = []\nproxy = { queue_timeout = "300ms" }\n',  # too slow for it
        "c": FAST + "gpus = []\nproxy = { queue_limit = 0 }\n",  # no queue at all
        "d": FAST + "gpus = []\nstart_limit_burst = 1\n",  # fails while requests wait
    }
    env = {
        "a": {"LANED_SIM_STARTUP": "1.5"},
        "b": {"LANED_SIM_STARTUP": "30"},
        "c": {"LANED_SIM_STARTUP": "30"},
        "d": {"LANED_SIM_STARTUP": "1", "LANED_SIM_FAIL_AT_START": "3"},
    }
    config = lane_config(harness, units, tmp_path, lanes, ports["a"], env=env, ports=ports)

    async def scenario() -> None:
        async with (
            api_server(harness, config, api_port) as sup,
            httpx.AsyncClient(base_url=f"http://127.0.0.1:{api_port}", timeout=60) as client,
        ):
            for lane in "abcd":
                sup.activate(lane)
            started = time.monotonic()
            waited, timed_out, full, failed = await asyncio.gather(
                *(client.post("/v1/completions", json=ask(lane)) for lane in "abcd")
            )
            assert waited.status_code == 200, waited.text
            assert time.monotonic() - started > 0.5, "it should have waited for the cold start"
            assert timed_out.status_code == 504 and "queue_timeout" in timed_out.text
            assert full.status_code == 503 and "queue_limit 0" in full.text
            # Failed while it waited (or just before): the reason, at once.
            assert failed.status_code == 503 and "crash-loop" in failed.text, failed.text

    run(scenario())
