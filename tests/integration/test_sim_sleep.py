"""The simulated engine's sleep mode against vLLM 0.32's source (laned/sim/sleep.py cites it):
dev-mode routes only, sleep that pauses the scheduler, a level-2 wake that answers wrongly
until reload_weights, the sleep-state gauge."""

from __future__ import annotations

import threading
from typing import Any

import httpx

from tests.helpers import wait_until
from tests.integration.test_sim import CHAT, metric

DEV = {"VLLM_SERVER_DEV_MODE": "1", "LANED_SIM_WEIGHTS_GIB": "0.2", "LANED_SIM_RELOAD_GIBPS": "1"}
PROMPT = {"messages": [{"role": "user", "content": "Name three rivers."}], "max_tokens": 12}


def answer(client: httpx.Client) -> str:
    response = client.post(CHAT, json=PROMPT)
    assert response.status_code == 200, response.text
    return str(response.json()["choices"][0]["message"]["content"])


def test_without_dev_mode_the_routes_do_not_exist(start_sim: Any) -> None:
    sim = start_sim("--enable-sleep-mode")
    with sim.client() as client:
        for method, path in (
            ("POST", "/sleep"),
            ("POST", "/wake_up"),
            ("GET", "/is_sleeping"),
            ("POST", "/collective_rpc"),
            ("POST", "/reset_prefix_cache"),
        ):
            assert client.request(method, path).status_code == 404, path
        # The gauge is vLLM's at every start (vllm/v1/metrics/loggers.py): awake.
        assert metric(client, "vllm:engine_sleep_state", sleep_state="awake") == 1
        assert metric(client, "vllm:engine_sleep_state", sleep_state="discard_all") == 0


def test_level_1_waits_for_the_request_in_flight_and_holds_new_ones_until_the_wake(
    start_sim: Any,
) -> None:
    sim = start_sim("--enable-sleep-mode", LANED_SIM_DECODE_TPS="20", **DEV)
    with sim.client(timeout=30) as client:
        done: dict[str, Any] = {}

        def long_request(key: str) -> None:
            body = {**PROMPT, "max_tokens": 30, "ignore_eos": True}
            done[key] = client.post(CHAT, json=body).json()

        first = threading.Thread(target=long_request, args=("first",))
        first.start()
        wait_until(lambda: metric(client, "vllm:num_requests_running") == 1, 10, "one running")
        slept = client.post("/sleep", params={"level": 1, "mode": "wait"})
        assert slept.json() == {"status": "sleeping", "level": 1}
        assert "first" in done, "a sleep with mode=wait answers after the request in flight"
        assert done["first"]["choices"][0]["finish_reason"] == "length"
        assert client.get("/is_sleeping").json() == {"is_sleeping": True}
        assert metric(client, "vllm:engine_sleep_state", sleep_state="weights_offloaded") == 1
        assert metric(client, "vllm:engine_sleep_state", sleep_state="awake") == 0
        assert client.get("/health").status_code == 200

        second = threading.Thread(target=long_request, args=("second",))
        second.start()
        wait_until(lambda: metric(client, "vllm:num_requests_waiting") == 1, 10, "one waiting")
        assert "second" not in done, "a sleeping engine served a request"
        woke = client.post("/wake_up")
        assert woke.json() == {"status": "awake", "tags": None}
        second.join(timeout=20)
        assert done["second"]["usage"]["completion_tokens"] == 30
        assert client.get("/is_sleeping").json() == {"is_sleeping": False}
        assert metric(client, "vllm:engine_sleep_state", sleep_state="awake") == 1
        assert metric(client, "vllm:sleep_mode_operation_duration_seconds_count", operation="wake") == 1  # fmt: skip
        log = sim.log()
        assert "seconds to fall asleep." in log and "Sleep mode freed 0.20 GiB memory" in log


def test_a_level_2_wake_answers_wrongly_until_the_weights_are_reloaded(start_sim: Any) -> None:
    sim = start_sim("--enable-sleep-mode", **DEV)
    with sim.client(timeout=30) as client:
        before = answer(client)
        assert client.post("/sleep", params={"level": 2}).status_code == 200
        assert metric(client, "vllm:engine_sleep_state", sleep_state="discard_all") == 1
        assert client.post("/wake_up").json()["status"] == "awake"
        wrong = answer(client)
        assert wrong != before, "a level-2 wake without reload_weights answered as before"
        assert client.get("/health").status_code == 200  # and health says nothing of it
        reload = client.post("/collective_rpc", json={"method": "reload_weights"})
        assert reload.status_code == 200
        assert client.post("/reset_prefix_cache").json() == {"success": True}
        assert answer(client) == before


def test_without_enable_sleep_mode_a_sleep_frees_nothing(start_sim: Any) -> None:
    sim = start_sim(**DEV)
    with sim.client(timeout=30) as client:
        before = answer(client)
        assert client.post("/sleep", params={"level": 2}).status_code == 200
        client.post("/wake_up")
        assert answer(client) == before
        assert "Sleep mode freed 0.00 GiB memory" in sim.log()


def test_bad_levels_and_modes_are_fastapis_422(start_sim: Any) -> None:
    sim = start_sim("--enable-sleep-mode", **DEV)
    with sim.client() as client:
        for params, where in (({"level": 3}, "level"), ({"level": "x"}, "level"), ({"mode": "now"}, "mode")):  # fmt: skip
            bad = client.post("/sleep", params=params)
            assert bad.status_code == 422, bad.text
            assert bad.json()["detail"][0]["loc"] == ["query", where]
        assert client.get("/is_sleeping").json() == {"is_sleeping": False}


def test_the_default_mode_aborts_the_requests_in_flight(start_sim: Any) -> None:
    sim = start_sim("--enable-sleep-mode", LANED_SIM_DECODE_TPS="20", **DEV)
    with sim.client(timeout=30) as client:
        done: dict[str, Any] = {}

        def long_request() -> None:
            body = {**PROMPT, "max_tokens": 200, "ignore_eos": True}
            done["answer"] = client.post(CHAT, json=body).json()

        running = threading.Thread(target=long_request)
        running.start()
        wait_until(lambda: metric(client, "vllm:num_requests_running") == 1, 10, "one running")
        assert client.post("/sleep").json() == {"status": "sleeping", "level": 1}
        running.join(timeout=10)
        assert done["answer"]["usage"]["completion_tokens"] < 200
        assert metric(client, "vllm:request_success_total", finished_reason="abort") == 1


def test_return_token_ids_gives_the_ids_beside_the_text(start_sim: Any) -> None:
    sim = start_sim("--enable-sleep-mode", **DEV)
    with sim.client(timeout=30) as client:
        body = {"prompt": "one, two,", "max_tokens": 6, "temperature": 0, "return_token_ids": True}
        first = client.post("/v1/completions", json=body).json()["choices"][0]
        again = client.post("/v1/completions", json=body).json()["choices"][0]
        assert len(first["token_ids"]) == 6 and first["token_ids"] == again["token_ids"]
        plain = client.post("/v1/completions", json={**body, "return_token_ids": None})
        assert "token_ids" not in plain.json()["choices"][0]
