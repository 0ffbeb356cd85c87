"""The simulated engine against itself, over real HTTP: startup, endpoints, counting, faults."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.helpers import port_open, wait_until

CHAT = "/v1/chat/completions"


def metric(client: httpx.Client, name: str, **labels: str) -> float:
    """One sample's value from the engine's /metrics."""
    for family in text_string_to_metric_families(client.get("/metrics").text):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                return float(sample.value)
    raise AssertionError(f"no sample {name} {labels}")


def ask(client: httpx.Client, content: str, **body: Any) -> dict[str, Any]:
    response = client.post(CHAT, json={"messages": [{"role": "user", "content": content}], **body})
    assert response.status_code == 200, response.text
    return response.json()  # type: ignore[no-any-return]


def test_port_is_closed_during_startup_and_open_after(start_sim: Any) -> None:
    sim = start_sim(ready=False, LANED_SIM_STARTUP="2")
    wait_until(
        lambda: "Loading safetensors checkpoint shards" in sim.log(),
        10,
        "the first startup log line",
    )
    assert not port_open(sim.port), "the port accepted connections while the engine was loading"
    sim.wait_ready(timeout=20)
    log = sim.log()
    for line in (
        "Loading safetensors checkpoint shards: 100% Completed | 8/8",
        "Loading weights took",
        "Capturing CUDA graphs",
        "Available KV cache memory:",
        "Application startup complete.",
    ):
        assert line in log, line
    assert log.index("Loading weights took") < log.index("Application startup complete.")
    with sim.client() as client:
        assert client.get("/health").status_code == 200
        assert "version" in client.get("/version").json()


def test_enforce_eager_skips_graph_capture_and_unknown_flags_are_logged(start_sim: Any) -> None:
    sim = start_sim(
        "--enforce-eager", "--tensor-parallel-size", "2", "--attention-config", '{"a":1}'
    )
    log = sim.log()
    assert "Capturing CUDA graphs" not in log
    assert (
        "accepted vLLM flag --tensor-parallel-size" in log
        and "accepted vLLM flag --attention-config" in log
    )


def test_api_key_guards_v1_but_not_health_or_metrics(start_sim: Any) -> None:
    sim = start_sim(VLLM_API_KEY="k-123")
    with sim.client() as anonymous, sim.client("k-123") as keyed, sim.client("wrong") as wrong:
        assert anonymous.get("/v1/models").status_code == 401
        assert (
            wrong.post(CHAT, json={"messages": [{"role": "user", "content": "hi"}]}).status_code
            == 401
        )
        models = keyed.get("/v1/models").json()
        assert models["data"][0]["id"] == "/models/sim"
        assert anonymous.get("/health").status_code == 200
        assert anonymous.get("/metrics").status_code == 200
    assert "k-123" not in sim.log()


def test_metrics_parse_and_promtool_accepts_them(start_sim: Any, tmp_path: Path) -> None:
    sim = start_sim(
        "--served-model-name", "dsv", "--speculative-config", '{"num_speculative_tokens": 5}'
    )
    with sim.client() as client:
        ask(client, "What is 2 + 2?")
        text = client.get("/metrics").text
    names = {f.name for f in text_string_to_metric_families(text)}
    assert {
        "vllm:num_requests_running",
        "vllm:kv_cache_usage_perc",
        "vllm:spec_decode_num_accepted_tokens",
        "vllm:prefix_cache_hits",
        "vllm:request_success",
        "vllm:e2e_request_latency_seconds",
    } <= names
    assert (
        'model_name="dsv"' in text
        and 'engine="0"' in text
        and "vllm:generation_tokens_created" in text
    )
    promtool = shutil.which("promtool")
    assert promtool, "promtool is missing (apt-get install prometheus)"
    result = subprocess.run(
        [promtool, "check", "metrics"], input=text, capture_output=True, text=True
    )
    # promtool parses the exposition (exit 1 when it cannot) and then lints it (exit 3).
    # vLLM's own names carry the `vllm:` prefix, and its histogram of tokens per engine step
    # is named vllm:iteration_tokens_total (vllm/v1/metrics/loggers.py): the linter flags
    # both on real vLLM too, and they are the only findings allowed.
    findings = [line for line in (result.stdout + result.stderr).splitlines() if line.strip()]
    assert result.returncode in (0, 3), findings
    allowed = (
        "metric names should not contain ':'",
        'vllm:iteration_tokens_total non-counter metrics should not have "_total" suffix',
    )
    assert findings and all(f.endswith(allowed) for f in findings), findings


def test_tokens_counted_equal_tokens_returned(start_sim: Any) -> None:
    sim = start_sim("--served-model-name", "m", LANED_SIM_DECODE_TPS="400")
    with sim.client() as client:
        usage = [
            ask(client, q)["usage"] for q in ("Hello there", "What is 6 * 7?", "Write a story", "x")
        ]
        chunks, stream_usage, choices = 0, None, []
        with client.stream(
            "POST",
            CHAT,
            json={
                "messages": [{"role": "user", "content": "Write an essay"}],
                "stream": True,
                "max_tokens": 40,
                "stream_options": {"include_usage": True},
            },
        ) as r:
            assert r.headers["content-type"].startswith("text/event-stream")
            for line in r.iter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                event = json.loads(line[6:])
                if event.get("usage"):
                    stream_usage = event["usage"]
                for choice in event["choices"]:
                    choices.append(choice)
                    if choice["delta"].get("content"):
                        chunks += 1
        assert stream_usage is not None and stream_usage["completion_tokens"] == chunks == 40
        # As vLLM streams it: the role, then one event per token, the last one carrying
        # finish_reason "length" (no empty event of its own after it).
        assert len(choices) == 41 and choices[-1]["delta"].get("content"), choices[-1]
        assert [c["finish_reason"] for c in choices] == [None] * 40 + ["length"]
        completion = sum(u["completion_tokens"] for u in usage) + chunks
        prompt = sum(u["prompt_tokens"] for u in usage) + stream_usage["prompt_tokens"]
        assert metric(client, "vllm:generation_tokens_total") == completion
        assert metric(client, "vllm:prompt_tokens_total") == prompt
        assert metric(client, "vllm:request_success_total", finished_reason="length") == 1
        assert metric(client, "vllm:request_success_total", finished_reason="stop") == 4


def test_completions_endpoint_and_prefix_cache(start_sim: Any) -> None:
    sim = start_sim()
    prompt = "shared system prompt " * 40
    with sim.client() as client:
        for _ in range(2):
            body = client.post("/v1/completions", json={"prompt": prompt, "max_tokens": 5}).json()
            assert body["object"] == "text_completion" and body["usage"]["completion_tokens"] <= 5
        assert metric(client, "vllm:prefix_cache_hits_total") > 0
        assert (
            metric(client, "vllm:prefix_cache_queries_total")
            >= 2 * body["usage"]["prompt_tokens"] - 2
        )


def test_acceptance_behaviours(start_sim: Any) -> None:
    sim = start_sim(
        "--reasoning-parser",
        "deepseek_v41",
        "--enable-auto-tool-choice",
        "--max-model-len",
        "20000",
    )
    tool = {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "weather for a city",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}},
                "required": ["city"],
            },
        },
    }
    with sim.client() as client:
        plain = ask(client, "Hello, who are you?")
        assert plain["choices"][0]["finish_reason"] == "stop"
        math = ask(client, "What is 17 × 23?", chat_template_kwargs={"thinking": True})
        message = math["choices"][0]["message"]
        assert message["content"].strip() == "391" and "17" in message["reasoning_content"]
        called = ask(client, "What is the weather in Lisbon?", tools=[tool])
        choice = called["choices"][0]
        assert choice["finish_reason"] == "tool_calls"
        call = choice["message"]["tool_calls"][0]
        assert json.loads(call["function"]["arguments"]) == {"city": "Lisbon"}
        follow = client.post(
            CHAT,
            json={
                "tools": [tool],
                "messages": [
                    {"role": "user", "content": "What is the weather in Lisbon?"},
                    {"role": "assistant", "content": None, "tool_calls": [call]},
                    {"role": "tool", "tool_call_id": call["id"], "content": "21C, clear"},
                ],
            },
        ).json()
        assert "21C, clear" in follow["choices"][0]["message"]["content"]
        haystack = "lorem ipsum dolor. " * 3000
        depth = len(haystack) // 3
        prompt = (
            haystack[:depth] + " The code is ZK-9921. " + haystack[depth:] + "\nWhat is the code?"
        )
        assert "ZK-9921" in ask(client, prompt)["choices"][0]["message"]["content"]
        too_long = client.post(
            CHAT, json={"messages": [{"role": "user", "content": "word " * 25000}]}
        )
        assert too_long.status_code == 400
        assert "maximum context length is 20000 tokens" in too_long.json()["error"]["message"]


def test_decode_is_paced_at_the_configured_rate(start_sim: Any) -> None:
    # Only a lower bound: a busy machine can be slower, never faster than the pace.
    sim = start_sim(LANED_SIM_DECODE_TPS="100")
    with sim.client() as client:
        started = time.monotonic()
        body = ask(client, "hi", max_tokens=50, ignore_eos=True)
        elapsed = time.monotonic() - started
    assert body["usage"]["completion_tokens"] == 50
    assert elapsed >= 49 / 100


SAMPLE_EVERY = 0.1  # seconds between two scrapes while a prefill runs


def test_a_long_prefill_counts_as_vllm_does(start_sim: Any) -> None:
    """Prompt tokens are counted when the prefill ends; meanwhile every chunk is an engine
    step (vllm:iteration_tokens_total) and the KV cache fills (vllm/v1/metrics/stats.py)."""
    sim = start_sim("--max-num-batched-tokens", "256", LANED_SIM_PREFILL_TPS="2000")
    prompt = "The river bends slowly around the old mill. " * 400  # ~3,600 tokens, ~1.8 s
    with sim.client() as client, ThreadPoolExecutor(1) as pool:
        before = metric(client, "vllm:iteration_tokens_total_count")
        reply = pool.submit(
            client.post,
            "/v1/completions",
            json={"prompt": prompt, "max_tokens": 4},
        )
        steps, kv, prompt_counted = [], [], []
        deadline = time.monotonic() + 10
        while not reply.done() and time.monotonic() < deadline:
            steps.append(metric(client, "vllm:iteration_tokens_total_count"))
            kv.append(metric(client, "vllm:kv_cache_usage_perc"))
            prompt_counted.append(metric(client, "vllm:prompt_tokens_total"))
            time.sleep(SAMPLE_EVERY)  # a sampling period, not a wait: the loop ends on done()
        usage = reply.result().json()["usage"]
        # The samples taken while the prompt's tokens were not counted yet: the prefill.
        during = [(st, k) for st, k, p in zip(steps, kv, prompt_counted, strict=True) if p == 0]
        assert len(during) > 5, "the prefill should have lasted a while"
        assert during[-1][0] > during[0][0] >= before, "each chunk is an engine step"
        kv_during = [k for _, k in during]
        assert kv_during == sorted(kv_during) and kv_during[-1] > kv_during[0] >= 0, (
            "the KV cache fills chunk by chunk"
        )
        assert metric(client, "vllm:prompt_tokens_total") == usage["prompt_tokens"]
        assert metric(client, "vllm:generation_tokens_total") == usage["completion_tokens"]


def test_older_vllm_exports_both_kv_usage_gauges(start_sim: Any) -> None:
    sim = start_sim(LANED_SIM_LEGACY_METRICS="1")
    with sim.client() as client:
        assert metric(client, "vllm:gpu_cache_usage_perc") == metric(
            client, "vllm:kv_cache_usage_perc"
        )


def test_a_generation_config_directory_behaves_as_vllms(start_sim: Any, tmp_path: Path) -> None:
    """--generation-config DIR replaces the model's config (its stop ids too) and drops values
    equal to Hugging Face's defaults: a GLM-like turn then runs on past its end marker."""
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "generation_config.json").write_text(
        '{"eos_token_id": [151329, 151336, 151338]}'
    )
    (tmp_path / "gen").mkdir()
    (tmp_path / "gen" / "generation_config.json").write_text(
        '{"temperature": 1.0, "top_p": 0.95, "x": 1}'
    )
    sim = start_sim("--generation-config", str(tmp_path / "gen"), model=str(tmp_path / "model"))
    with sim.client() as client:
        state = client.get("/sim/state").json()
        assert state["generation_defaults"] == {"top_p": 0.95}
        assert 151338 not in state["stop_ids"]
        reply = client.post(
            "/v1/chat/completions",
            json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 40},
        ).json()
        assert reply["choices"][0]["finish_reason"] == "length"
        assert "<|user|>" in reply["choices"][0]["message"]["content"]
    assert f"Using default chat sampling params from {tmp_path / 'gen'}" in sim.log()


@pytest.mark.parametrize("code", [0, 3])
def test_fault_exit(start_sim: Any, code: int) -> None:
    sim = start_sim()
    with sim.client() as client:
        assert client.post("/sim/fault", json={"kind": "exit", "code": code}).status_code == 200
    assert sim.wait_exit(timeout=10) == code


def test_fault_crash_is_a_signal(start_sim: Any) -> None:
    sim = start_sim()
    with sim.client() as client:
        client.post("/sim/fault", json={"kind": "crash"})
    assert sim.wait_exit(timeout=10) == -signal.SIGKILL


def test_fault_engine_dead_is_503_then_500_then_exit_0(start_sim: Any) -> None:
    sim = start_sim()
    with sim.client() as client:
        client.post("/sim/fault", json={"kind": "engine-dead"})
        assert client.get("/health").status_code == 503
        failed = client.post(CHAT, json={"messages": [{"role": "user", "content": "hi"}]})
        assert failed.status_code == 500 and failed.json()["error"]["type"] == "EngineDeadError"
    started = time.monotonic()
    assert sim.wait_exit(timeout=15) == 0
    assert time.monotonic() - started < 15
    assert "EngineDeadError" in sim.log()


def test_engine_death_ends_at_the_watchdogs_next_look_or_stays_when_told(start_sim: Any) -> None:
    """vLLM's watchdog looks every 5 s (vllm/entrypoints/launcher.py): with no request failing,
    the exit comes within 5 s; VLLM_KEEP_ALIVE_ON_ENGINE_DEATH keeps the server up."""
    sim = start_sim()
    with sim.client() as client:
        client.post("/sim/fault", json={"kind": "engine-dead"})
    assert sim.wait_exit(timeout=10) == 0
    kept = start_sim(VLLM_KEEP_ALIVE_ON_ENGINE_DEATH="1")
    with kept.client() as client:
        client.post("/sim/fault", json={"kind": "engine-dead"})
        client.post(CHAT, json={"messages": [{"role": "user", "content": "hi"}]})
        wait_until(lambda: "engine core exited unexpectedly" in kept.log(), 5, "the death logged")
        assert kept.process.poll() is None and client.get("/health").status_code == 503


def test_a_taken_port_fails_at_once_not_after_the_cold_start(start_sim: Any) -> None:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        sim = start_sim("--port", str(port), ready=False, LANED_SIM_STARTUP="30")
        assert sim.wait_exit(timeout=10) == 1
    assert "Address already in use" in sim.log()
    assert "Loading safetensors" not in sim.log()


def test_fault_stall_keeps_health_but_freezes_work(start_sim: Any) -> None:
    sim = start_sim("--max-num-seqs", "2")
    with sim.client() as client:
        before = metric(client, "vllm:generation_tokens_total")
        client.post("/sim/fault", json={"kind": "stall"})

        def hang() -> None:
            with sim.client(timeout=60) as c, pytest.raises(httpx.HTTPError):
                c.post(CHAT, json={"messages": [{"role": "user", "content": "hi"}]}, timeout=3)

        threads = [threading.Thread(target=hang) for _ in range(3)]
        for thread in threads:
            thread.start()
        wait_until(
            lambda: metric(client, "vllm:num_requests_waiting") >= 3, 10, "requests piling up"
        )
        assert client.get("/health").status_code == 200
        assert metric(client, "vllm:generation_tokens_total") == before
        for thread in threads:
            thread.join(timeout=10)


def test_sigterm_is_a_graceful_exit_0_even_during_startup(start_sim: Any) -> None:
    sim = start_sim()
    sim.process.send_signal(signal.SIGTERM)
    assert sim.wait_exit(timeout=10) == 0
    assert "Application shutdown complete." in sim.log()
    starting = start_sim(ready=False, LANED_SIM_STARTUP="30")
    wait_until(lambda: "Loading safetensors" in starting.log(), 10, "startup to begin")
    starting.process.send_signal(signal.SIGTERM)
    assert starting.wait_exit(timeout=10) == 0


def test_shutdown_closes_the_port_first_and_exits_after_the_engine_ends(start_sim: Any) -> None:
    sim = start_sim(LANED_SIM_SHUTDOWN="3")
    sim.process.send_signal(signal.SIGTERM)
    wait_until(lambda: not port_open(sim.port), 10, "the port to close")
    assert sim.process.poll() is None, "the engine exited before its shutdown was over"
    assert sim.wait_exit(timeout=15) == 0
    log = sim.log()
    assert log.index("Shutting down engine core") < log.index("Application shutdown complete.")


def test_idle_connections_are_closed_like_vllms_uvicorn_does(start_sim: Any) -> None:
    sim = start_sim()
    request = f"GET /health HTTP/1.1\r\nHost: 127.0.0.1:{sim.port}\r\n\r\n".encode()
    with socket.create_connection(("127.0.0.1", sim.port), timeout=15) as conn:
        for _ in range(2):  # back-to-back requests share the connection
            conn.sendall(request)
            reply = conn.recv(4096)
            assert reply.startswith(b"HTTP/1.1 200"), reply
        started = time.monotonic()
        assert conn.recv(4096) == b"", "an idle connection must be closed by the engine"
        assert time.monotonic() - started < 14  # within KEEP_ALIVE (5 s), not the socket timeout


def test_fail_at_start_exits_with_the_code_before_the_port_opens(start_sim: Any) -> None:
    sim = start_sim(ready=False, LANED_SIM_FAIL_AT_START="7", LANED_SIM_STARTUP="0.5")
    assert sim.wait_exit(timeout=10) == 7
    assert "EngineCore failed to start" in sim.log()
    assert not port_open(sim.port)


def test_bad_arguments_are_refused_with_a_reason(start_sim: Any) -> None:
    for argv, env, words in (
        (["serve"], {}, "model"),
        (["run", "x"], {}, "serve"),
        (["serve", "m", "--port", "abc"], {}, "not a whole number"),
        (["serve", "m"], {"LANED_SIM_DECODE_TPS": "fast"}, "LANED_SIM_DECODE_TPS"),
    ):
        result = subprocess.run(
            ["laned", "sim", *argv],
            capture_output=True,
            text=True,
            env={"PATH": os.environ["PATH"], **env},
        )
        assert result.returncode == 2 and words in result.stderr, result.stderr


# Startup lines that say nothing about a phase, and why they are allowed to.
NOT_PHASES = (
    "vLLM API server version",  # the banner
    "non-default args",  # the arguments
    ") with config: ",  # the engine's config dump: every feature by name, none a phase
    "accepted vLLM flag",  # the simulator's own note on a flag it ignores
    "Using default chat sampling params",  # the generation config (checked elsewhere)
    "Maximum concurrency for",  # part of the memory profile, after its first line
    "Route: ",  # the routes the API server lists after "Available routes are:"
    "Started server process",  # uvicorn, between the API server's start and serving
    "Waiting for application startup",  # uvicorn, likewise
)


def startup_lines(log: str) -> list[str]:
    head = log.split("Application startup complete.")[0]
    return [line for line in head.split("\n")[:-1] if line.strip()]  # the last: "INFO:     "


@pytest.mark.parametrize(
    ("args", "env"),
    [
        ((), {"LANED_SIM_JIT": "0.5"}),
        (("--load-format", "fastsafetensors", "--no-enable-flashinfer-autotune"), {"LANED_SIM_JIT": "0.5", "LANED_SIM_OLD_API_LINE": "1"}),
        (("--enforce-eager",), {}),
    ],
    ids=["cold", "no-shard-bar-no-autotune-old-api-line", "eager"],
)  # fmt: skip
def test_laneds_phase_table_knows_every_startup_line(
    start_sim: Any, tmp_path: Path, args: tuple[str, ...], env: dict[str, str]
) -> None:
    from laned.core.phases import last_segment
    from laned.engines.vllm import read_line

    for round_ in ("first", "cached"):
        sim = start_sim(*args, VLLM_CACHE_ROOT=str(tmp_path / "cache"), **env)
        lines = startup_lines(sim.log())
        unknown = [
            line
            for line in lines
            if read_line(line) is None and not any(n in last_segment(line) for n in NOT_PHASES)
        ]
        assert unknown == [], f"{round_} start: lines laned's phase table does not know"
        sim.process.terminate()
        sim.wait_exit(timeout=10)


def test_startup_prints_as_vllm_does(start_sim: Any, tmp_path: Path) -> None:
    from laned.engines.vllm import read_line

    cache = str(tmp_path / "cache")
    cold = start_sim(VLLM_CACHE_ROOT=cache, LANED_SIM_JIT="0.5")
    log = cold.log()
    # tqdm redraws with \r and ends a bar with a newline; the shard bar ends each redraw with one.
    graphs = next(line for line in log.split("\n") if "Capturing CUDA graphs" in line)
    assert graphs.count("\r") > 5 and graphs.rstrip().endswith("it/s]")
    assert read_line(graphs) is not None and read_line(graphs).progress == 100.0  # type: ignore[union-attr]
    assert sum("DeepGemm(fp8_gemm_nt) warmup" in line for line in log.split("\n")) == 3
    for text in ("Autotuning process starts", "Compiling a graph for", "init engine (profile, create kv cache, warmup model) took", "Supported tasks:", "Starting vLLM server on http://", "Available routes are:"):  # fmt: skip
        assert text in log, text
    cold.process.terminate()
    cold.wait_exit(timeout=10)
    warm = start_sim(VLLM_CACHE_ROOT=cache, LANED_SIM_JIT="0.5").log()
    assert "Directly load the compiled graph(s) for compile range (1, 8192) from the cache" in warm
    assert "Using FlashInfer autotune cache file" in warm and "Autotuning process" not in warm


@pytest.mark.parametrize("drain", [True, False], ids=["shutdown-timeout", "default-aborts"])
def test_shutdown_timeout_drains_requests_in_flight(start_sim: Any, drain: bool) -> None:
    """--shutdown-timeout N: after SIGTERM requests in flight may finish for up to N s while
    the port still listens, /health says 200 and a new request fails with 500, as real vLLM
    0.32 did (docs/simulator.md); without it they are cut at once."""
    args = ("--shutdown-timeout", "10") if drain else ()
    sim = start_sim(*args, LANED_SIM_DECODE_TPS="20")
    with sim.client() as client, ThreadPoolExecutor(1) as pool:
        running = pool.submit(
            client.post,
            "/v1/completions",
            json={"prompt": "hi", "max_tokens": 40, "ignore_eos": True},
        )
        wait_until(lambda: metric(client, "vllm:generation_tokens_total") >= 5, 10, "decoding")
        sim.process.send_signal(signal.SIGTERM)
        if drain:
            refused = wait_until(
                lambda: (
                    (r := client.post("/v1/completions", json={"prompt": "x"})).status_code == 500
                    and r
                ),
                5,
                "new requests refused while it drains",
            )
            assert refused.json()["error"]["type"] == "InternalServerError"
            assert port_open(sim.port) and client.get("/health").status_code == 200
            assert running.result(timeout=15).json()["usage"]["completion_tokens"] == 40
        else:
            with pytest.raises(httpx.HTTPError):
                running.result(timeout=15)
    assert sim.wait_exit(timeout=15) == 0


# Sample names real vLLM exports (vllm/v1/metrics/loggers.py, PrometheusStatLogger; counters
# gain `_total` from prometheus_client, histograms `_count`/`_sum`/`_bucket`).
# gpu_cache_usage_perc: exported by 0.9 and 0.10 beside kv_cache_usage_perc, hidden since.
VLLM_SAMPLES = {
    "vllm:num_requests_running",
    "vllm:num_requests_waiting",
    "vllm:kv_cache_usage_perc",
    "vllm:gpu_cache_usage_perc",
    "vllm:prompt_tokens_total",
    "vllm:generation_tokens_total",
    "vllm:iteration_tokens_total_count",
    "vllm:iteration_tokens_total_sum",
}


def test_every_engine_metric_laned_reads_is_vllms_and_the_simulators(start_sim: Any) -> None:
    from laned.engines.vllm import KV_USAGE, SUMMED

    read = set(SUMMED) | set(KV_USAGE)
    assert read <= VLLM_SAMPLES, f"laned reads names vLLM does not export: {read - VLLM_SAMPLES}"
    sim = start_sim(LANED_SIM_LEGACY_METRICS="1")
    with sim.client() as client:
        exported = {
            s.name
            for family in text_string_to_metric_families(client.get("/metrics").text)
            for s in family.samples
        }
    assert read <= exported, f"the simulator does not export {read - exported}"
