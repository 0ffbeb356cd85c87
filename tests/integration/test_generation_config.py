"""Seed 000's sampling through laned's rendered lane against the simulator, which applies
vLLM's generation-config rules: the sampling takes effect as written (temperature 1.0
included) and the model's own stop ids stay, so turns end where the model ends them."""

from __future__ import annotations

import json
from pathlib import Path

import httpx

from tests.helpers import free_port
from tests.integration.conftest import Harness, Units
from tests.integration.lanes import FAST, lane_config
from tests.integration.test_supervisor import run, supervising

SEED_000_SAMPLING = "sampling = { temperature = 1.0, top_p = 0.95 }\n"
GLM_GENERATION_CONFIG = {"eos_token_id": [151329, 151336, 151338], "top_k": 40}


def test_seed_000_sampling_applies_and_the_models_stop_ids_stay(
    harness: Harness, units: Units, tmp_path: Path
) -> None:
    port = free_port()
    config = lane_config(harness, units, tmp_path, {"a": FAST + SEED_000_SAMPLING}, port)
    (tmp_path / "models" / "a" / "generation_config.json").write_text(
        json.dumps(GLM_GENERATION_CONFIG)
    )

    async def scenario() -> None:
        async with supervising(harness, config) as sup, httpx.AsyncClient() as client:
            await sup.activate("a")
            state = (await client.get(f"http://127.0.0.1:{port}/sim/state")).json()
            # laned's sampling over the model's own defaults; 1.0 is not dropped as a default.
            assert state["generation_defaults"] == {"temperature": 1.0, "top_k": 40, "top_p": 0.95}
            assert {151329, 151336, 151338} <= set(state["stop_ids"])
            reply = await client.post(
                f"http://127.0.0.1:{port}/v1/chat/completions",
                json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 200},
            )
            choice = reply.json()["choices"][0]
            assert choice["finish_reason"] == "stop", choice
            assert "<|user|>" not in choice["message"]["content"]

    run(scenario())
