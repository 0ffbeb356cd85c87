"""Stall detection against vLLM's real counter timing: the prompt's tokens are counted only
when its prefill ends (vllm/v1/metrics/stats.py), so a long prefill keeps both token counters
flat; it must not be called a stall. (A wedged engine still is, soon after stall_after:
test_supervisor.py::test_a_stalled_engine_is_degraded_then_restarted.)"""

from __future__ import annotations

import time
from pathlib import Path

import httpx

from laned.core.lanes import LaneState
from tests.helpers import free_port
from tests.integration.conftest import Harness, Units
from tests.integration.lanes import lane_config
from tests.integration.test_supervisor import run, saw, supervising

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
