"""Stall detection against vLLM's real counter timing: the prompt's tokens are counted only
when its prefill ends (vllm/v1/metrics/stats.py), so a long prefill keeps both token counters
flat; it must not be called a stall. A wedged engine still is, soon after stall_after."""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path

import httpx
import pytest

from laned.lanes import LaneState
from tests.helpers import free_port
from tests.integration.conftest import Harness, Units
from tests.integration.lanes import lane_config
from tests.integration.test_supervisor import run, saw, supervising, until

PROBING = 'restart_sec = "200ms"\nprobe = { interval = "200ms", stall_after = "1s", start_interval_max = "200ms" }\n'
# Prefill at 2,000 tokens/s in chunks of 256 tokens: an engine step every 0.13 s.
SLOW_PREFILL = {"LANED_SIM_PREFILL_TPS": "2000"}
ARGS = 'args = ["--max-num-batched-tokens", "256"]\n'


def test_a_long_prefill_is_not_a_stall(harness: Harness, units: Units, tmp_path: Path) -> None:
    port = free_port()
    config = lane_config(
        harness, units, tmp_path, {"a": PROBING + ARGS}, port, env={"a": SLOW_PREFILL}
    )
    prompt = "The river bends slowly around the old mill. " * 800  # ~7,200 tokens: ~3.6 s

    async def scenario() -> None:
        async with supervising(harness, config) as sup, httpx.AsyncClient(timeout=60) as client:
            await sup.activate("a")
            started = time.monotonic()
            reply = await client.post(
                f"http://127.0.0.1:{port}/v1/completions",
                json={"prompt": prompt, "max_tokens": 8},
            )
            took = time.monotonic() - started
            assert reply.status_code == 200 and reply.json()["usage"]["completion_tokens"] == 8
            assert took > 3 * 1.0, "the prefill should outlast stall_after several times"
            assert not saw(sup, "a", LaneState.DEGRADED), [e.reason for e in sup.events]
            assert sup.statuses["a"].state is LaneState.READY and sup.statuses["a"].restarts == 0

    run(scenario())


def test_a_wedged_engine_is_a_stall_soon_after_stall_after(
    harness: Harness, units: Units, tmp_path: Path
) -> None:
    port = free_port()
    config = lane_config(harness, units, tmp_path, {"a": PROBING}, port)

    def hang() -> None:
        with pytest.raises(httpx.HTTPError):
            httpx.post(f"http://127.0.0.1:{port}/v1/chat/completions",
                       json={"messages": [{"role": "user", "content": "hi"}]}, timeout=20)  # fmt: skip

    async def scenario() -> None:
        async with supervising(harness, config) as sup:
            await sup.activate("a")
            async with httpx.AsyncClient() as client:
                await client.post(f"http://127.0.0.1:{port}/sim/fault", json={"kind": "stall"})
            thread = threading.Thread(target=hang)
            thread.start()
            busy_since = time.time()
            await until(lambda: saw(sup, "a", LaneState.DEGRADED), 15, "the stall")
            degraded = next(
                e for e in sup.events if e.lane == "a" and e.to_state is LaneState.DEGRADED
            )
            # stall_after (1 s) + one probe (0.2 s); the rest is slack for a loaded machine.
            assert degraded.at - busy_since < 1.0 + 0.2 + 3.0
            assert degraded.reason.startswith("stalled")
            await asyncio.get_running_loop().run_in_executor(None, thread.join, 30)

    run(scenario())
