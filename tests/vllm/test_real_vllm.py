"""laned against real vLLM 0.32 (CPU build) with a tiny random model, through `laned serve`:
its cold start as laned reports it, readiness, /sd, the /metrics laned reads, the sampling
defaults laned passes, chat and streams through :9000/v1, a long decode under load that is
not a stall, `laned check` and `laned bench`, a wedged engine (EngineCore stopped under
running requests) caught as stalled, vLLM's own death (EngineCore killed: the API server
exits 0) taken for a failure, both restarted, and a stream that a swap drains, not cuts.

One engine lane for the whole story (and a simulated lane to swap to): each start costs ~40 s
on 2 cores, so the test starts it three times (the first start and two restarts) and asserts
at every step.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from laned.adapters.probes import Probe, parse_engine_metrics
from laned.core.phases import Phase
from laned.engines.vllm import KV_USAGE, SUMMED
from tests.helpers import free_port, journal, wait_until
from tests.integration.lanes import FAST
from tests.reliability.conftest import unit_property
from tests.vllm.conftest import RealVllm
from tests.vllm.prometheus import Prometheus, empty_queries

START = 240  # seconds a real vLLM start may take here (~40 s alone on 2 cores)


def lane_toml(real: RealVllm) -> str:
    """The lane, all of its processes on CPU 0 (taskset, VLLM_CPU_OMP_THREADS_BIND): given
    both cores, EngineCore and its worker spin on them while it decodes and its API server
    answers nothing until the batch ends (a scrape waited 13.8 s); on one core, 30 ms.
    A stop that meets hung requests (the wedge below) ends at stop_timeout: 8 s here."""
    return (
        'start_timeout = "5m"\nrestart_sec = "1s"\nstop_timeout = "8s"\n'
        'probe = { interval = "1s", stall_after = "2s", start_interval_max = "1s" }\n'
        "sampling = { temperature = 0.6 }\n"
        'args = ["--dtype", "float32", "--enforce-eager", "--max-model-len", "2048"]\n'
        "[lanes.v.exec]\n"
        f'command = ["taskset", "-c", "0", "{real.python}", "-m", '
        f'"vllm.entrypoints.openai.api_server", "--model", "{real.model}"]\n'
        "[lanes.v.env]\n"
        'HF_HUB_OFFLINE = "1"\nVLLM_NO_USAGE_STATS = "1"\nVLLM_HOST_IP = "127.0.0.1"\n'
        'VLLM_CPU_KVCACHE_SPACE = "1"\nVLLM_CPU_OMP_THREADS_BIND = "0"\n'
    )


def view(url: str) -> dict[str, Any]:
    return httpx.get(f"{url}/lanes/v", timeout=10).json()  # type: ignore[no-any-return]


def ready_again(url: str, restarts: int) -> dict[str, Any]:
    return wait_until(  # type: ignore[no-any-return]
        lambda: (v := view(url))["state"] == "ready" and v["restarts"] >= restarts and v,
        START,
        f"lane v ready after restart {restarts}",
        interval=0.5,
    )


def engine_core(main_pid: int, title: bytes = b"VLLM::EngineCore") -> int:
    """The pid of the lane's VLLM::EngineCore, a descendant of the unit's main process."""
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            if not (proc / "cmdline").read_bytes().startswith(title):
                continue
            pid = int(proc.name)
            while pid > 1:  # walk up to the unit's main process
                stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
                pid = int(stat[1])
                if pid == main_pid:
                    return int(proc.name)
        except (OSError, ValueError, IndexError):
            continue
    raise AssertionError(f"no {title.decode()} under pid {main_pid}")


def engine_load(port: int) -> float:
    """Requests running or waiting, from the engine's own /metrics."""
    sample = parse_engine_metrics(httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=60).text)
    return sample.running + sample.waiting


def load(port: int, count: int) -> list[threading.Thread]:
    """`count` long decodes sent to the engine itself; a restart cuts them (that is fine)."""
    body = {"model": "v", "prompt": "Wedge", "max_tokens": 1900, "ignore_eos": True}

    def post() -> None:
        with contextlib.suppress(httpx.HTTPError):
            httpx.post(f"http://127.0.0.1:{port}/v1/completions", json=body, timeout=600)

    threads = [threading.Thread(target=post, daemon=True) for _ in range(count)]
    for thread in threads:
        thread.start()
    return threads


def stalled(url: str, since: float) -> bool:
    return any(e["reason"].startswith("stalled: ") for e in events(url, since))


def wedge(url: str, port: int, main: int) -> None:
    """Stop VLLM::EngineCore (SIGSTOP) once its /metrics says requests run, until laned says
    stalled. A batch that ends before the stop lands comes back whole, and laned (rightly)
    sees nothing stalled: then the engine is let go and the step made again."""
    core = engine_core(main)
    for attempt in range(3):
        since = time.time()
        threads = load(port, 4)
        wait_until(lambda: engine_load(port) >= 1, 60, "requests running on the engine")
        os.kill(core, signal.SIGSTOP)
        done = wait_until(
            lambda since=since, threads=threads: (  # type: ignore[misc]
                "stalled" if stalled(url, since) else
                "ended" if not any(t.is_alive() for t in threads) else None
            ),
            60,
            "laned to call the engine stalled, or the batch to end",
            0.2,
        )  # fmt: skip
        if done == "stalled":
            return
        print(f"wedge attempt {attempt}: the batch ended before EngineCore stopped")
        os.kill(core, signal.SIGCONT)
    raise AssertionError("three batches ended before EngineCore could be stopped under them")


def in_flight(url: str, lane: str) -> int:
    """Requests laned's proxy has in flight to a lane."""
    got = httpx.get(f"{url}/lanes/{lane}", timeout=10).json()
    return int((got.get("proxy") or {}).get("in_flight", 0))


def events(url: str, since: float) -> list[dict[str, Any]]:
    got = httpx.get(f"{url}/events", params={"lane": "v", "limit": 500}, timeout=10)
    return [e for e in got.json()["events"] if e["at"] >= since]


@pytest.mark.timeout(900)
def test_laned_follows_real_vllm_from_its_start_to_its_death(
    daemon: Any, harness: Any, real_vllm: RealVllm, tmp_path: Path, request: Any
) -> None:
    port = free_port()
    # v: real vLLM; w: a simulated lane on the same port (so the same group) to swap to.
    serve = daemon({"v": lane_toml(real_vllm), "w": FAST}, daemon_toml='default_lane = "v"\n',
                   ready=0, ports={"v": port, "w": port})  # fmt: skip
    # A real Prometheus scrapes laned and, through its /sd, the engine, all along the story:
    # at its end every query of the Grafana dashboard must return series.
    prometheus = Prometheus(tmp_path, serve.url.removeprefix("http://"))
    request.addfinalizer(prometheus.close)
    first = ready_again(serve.url, 0)
    unit = first["unit"]

    # The cold start, phase by phase as laned read them from vLLM's own lines: no phase from
    # the config dump (enable_flashinfer_autotune=True on a build without FlashInfer).
    wanted = {p.value for p in (Phase.LOADING_WEIGHTS, Phase.WEIGHTS_LOADED, Phase.PROFILING, Phase.API_SERVER)}  # fmt: skip
    # journald may hand the last lines over after the engine answered: waited for.
    phases = wait_until(
        lambda: wanted <= set(p := view(serve.url)["last_phases"]) and list(p), 10, "the phases"
    )
    assert Phase.AUTOTUNE.value not in phases and Phase.CUDA_GRAPHS.value not in phases, phases
    for phase in (Phase.LOADING_WEIGHTS, Phase.WEIGHTS_LOADED, Phase.PROFILING, Phase.API_SERVER):
        assert phase.value in phases, phases
    # The sampling defaults laned passed (--override-generation-config): vLLM says it uses them.
    log = journal(unit, 400)
    assert "Default vLLM sampling parameters have been overridden" in log
    assert "'temperature': 0.6" in log

    # Readiness and service discovery.
    targets = httpx.get(f"{serve.url}/sd", timeout=10).json()
    assert any(f"127.0.0.1:{port}" in t for group in targets for t in group["targets"]), targets

    # Every engine metric laned reads exists on the real page, with the labels it expects.
    page = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text
    samples = {s.name: s.labels for f in text_string_to_metric_families(page) for s in f.samples}
    for name in (*SUMMED, "vllm:kv_cache_usage_perc"):
        assert name in samples, f"{name} is not on real vLLM's /metrics"
        assert "model_name" in samples[name] and "engine" in samples[name], samples[name]
    assert set(KV_USAGE) - {"vllm:gpu_cache_usage_perc"} <= set(samples)
    # Sleep mode's gauge is there from the start, awake; its routes are dev mode's alone.
    awake = [
        s.value
        for f in text_string_to_metric_families(page)
        for s in f.samples
        if s.name == "vllm:engine_sleep_state" and s.labels.get("sleep_state") == "awake"
    ]
    assert awake == [1.0], awake
    for path in ("/sleep", "/wake_up", "/collective_rpc"):
        assert httpx.post(f"http://127.0.0.1:{port}{path}", timeout=10).status_code == 404, path

    # The canary's request (laned.core.canary) as real vLLM answers it: token ids beside the
    # text (return_token_ids), the same ones twice (greedy).
    async def canary_twice() -> tuple[Any, Any]:
        probe = Probe()
        try:
            return (
                await probe.engine(port, "v").canary(120),
                await probe.engine(port, "v").canary(120),
            )
        finally:
            await probe.close()

    first, again = asyncio.run(canary_twice())
    assert first.token_ids is not None and 0 < len(first.token_ids) <= 16, first
    assert first == again, (first, again)

    # Chat and a stream through laned's OpenAI endpoint.
    with httpx.Client(base_url=f"{serve.url}/v1", timeout=120) as client:
        chat = client.post("/chat/completions", json={
            "model": "v", "messages": [{"role": "user", "content": "What is 17 x 23?"}],
            "max_tokens": 16})  # fmt: skip
        assert chat.status_code == 200, chat.text
        assert chat.json()["usage"]["completion_tokens"] > 0
        with client.stream("POST", "/completions", json={
            "model": "v", "prompt": "The quick brown fox", "max_tokens": 16, "stream": True,
            "ignore_eos": True, "stream_options": {"include_usage": True}}) as stream:  # fmt: skip
            chunks = [line for line in stream.iter_lines() if line.startswith("data: ")]
        assert chunks[-1] == "data: [DONE]", chunks[-3:]
        # Not one event per token: vLLM merges a request's deltas when its API server reads
        # them slower than the engine makes them (vllm/v1/engine/output_processor.py,
        # RequestOutputCollector.put), as on CI's 2 cores. What holds: the usage counts all 16,
        # and they came in more than one event.
        sent = [json.loads(c.removeprefix("data: ")) for c in chunks[:-1]]
        assert sent[-1]["usage"]["completion_tokens"] == 16, sent[-1]
        assert sum(1 for e in sent if e["choices"]) >= 2, chunks[-3:]
        # The engine's load, read from its /metrics at each probe.
        wait_until(lambda: view(serve.url)["engine"] is not None, 10, "the engine's load")

        # A decode longer than stall_after (2 s) under load is progress, not a stall.
        since = time.time()
        started = time.monotonic()
        long = client.post("/completions", json={
            "model": "v", "prompt": "Tools, reasoning, context", "max_tokens": 1900,
            "ignore_eos": True, "temperature": 0})  # fmt: skip
        took = time.monotonic() - started
        assert long.status_code == 200 and long.json()["usage"]["completion_tokens"] == 1900
        assert took > 2, f"the decode took {took:.1f} s: too short to tell progress from a stall"
        print(f'FIGURES real-vllm-decode {{"tokens": 1900, "seconds": {took:.2f}}}')
        assert view(serve.url)["state"] == "ready"
        assert not [e for e in events(serve.url, since) if e["to"] in ("degraded", "restarting")]

    # laned check and laned bench run against it: a random model fails the answer gates,
    # but every request is one the engine takes (sized by its own tokenizer, /tokenize, and
    # its window, 2048), and each gate and figure reports.
    def laned(*args: str) -> Any:
        ran = subprocess.run([sys.executable, "-m", "laned", "--config", str(serve.path), *args],
                             env=harness.env, capture_output=True, text=True, timeout=600)  # fmt: skip
        assert ran.stdout.strip(), ran.stderr
        return json.loads(ran.stdout)

    checked = laned("check", "v", "--json")
    gates = checked["gates"]
    assert set(gates) == {"load", "chat", "reasoning", "tools", "context", "speed"}, gates
    # The one refusal allowed: the lane has no tool parser, and vLLM says so.
    refused = [g["gate"] for g in gates.values() if "answered 4" in g["reason"]]
    assert refused in ([], ["tools"]), gates
    assert not refused or "--enable-auto-tool-choice" in gates["tools"]["reason"], gates
    context = gates["context"]["measured"]
    assert context["max_model_len"] == 2048 and 0.7 <= context["fill"] <= 0.85, context
    benched = laned("bench", "v", "--json", "--concurrency", "1,2", "--contexts", "1000,1900")
    assert set(benched["prefill_tok_s"]) and all(v > 0 for v in benched["prefill_tok_s"].values())
    print(f"FIGURES real-vllm-check {json.dumps({k: g['passed'] for k, g in gates.items()})}")
    print(f"FIGURES real-vllm-bench {json.dumps(benched['prefill_tok_s'])}")

    # A wedged engine: EngineCore stopped under running requests. The API server still
    # answers /health; nothing moves, so laned calls it stalled (stall_after 2 s), restarts.
    # Its stop meets the hung requests: uvicorn waits for their connections until systemd
    # kills it at stop_timeout (8 s here), and the last exit says so.
    main = int(unit_property(harness, "MainPID", unit))
    wedge(serve.url, port, main)
    again = ready_again(serve.url, 1)
    assert again["last_exit"]["verdict"] == "failure", again["last_exit"]
    assert "seen first as stalled: " in again["last_exit"]["reason"], again["last_exit"]
    print(f"FIGURES real-vllm-wedged {json.dumps(again['last_exit']['reason'])}")

    # vLLM's own death: EngineCore killed, the API server exits 0 a few seconds later.
    main = int(unit_property(harness, "MainPID", unit))
    since = time.time()
    os.kill(engine_core(main), signal.SIGKILL)
    again = ready_again(serve.url, 2)
    assert again["last_exit"]["verdict"] == "failure", again["last_exit"]
    assert again["last_exit"]["code"] == 0 or "health" in again["last_exit"]["reason"], again
    said = [e["reason"] for e in events(serve.url, since)]
    assert any("(failure)" in reason for reason in said), said
    assert int(unit_property(harness, "MainPID", unit)) != main

    # A swap drains a stream on real vLLM: the stream ends whole, then v stops and w starts.
    ended: list[dict[str, Any]] = []

    def drained() -> None:
        body = {"model": "v", "prompt": "Drain", "max_tokens": 1900, "ignore_eos": True,
                "stream": True, "stream_options": {"include_usage": True}}  # fmt: skip
        with httpx.stream("POST", f"{serve.url}/v1/completions", json=body, timeout=300) as got:
            lines = [line for line in got.iter_lines() if line.startswith("data: ")]
        ended.append({"last": lines[-1], "usage": json.loads(lines[-2][6:]).get("usage")})

    reader = threading.Thread(target=drained)
    reader.start()
    wait_until(lambda: in_flight(serve.url, "v") >= 1, 60, "a stream in flight on v")
    assert httpx.post(f"{serve.url}/lanes/w/activate", timeout=30).status_code == 202
    wait_until(lambda: view(serve.url)["state"] == "stopping", 60, "v draining", 0.1)
    # A request for w meanwhile waits in w's queue (w is on its way) and is answered by w.
    waited: list[int] = []
    asker = threading.Thread(target=lambda: waited.append(httpx.post(
        f"{serve.url}/v1/completions", json={"model": "w", "prompt": "hi", "max_tokens": 2},
        timeout=300).status_code))  # fmt: skip
    asker.start()
    reader.join(300)
    assert ended and ended[0]["last"] == "data: [DONE]", ended
    assert ended[0]["usage"]["completion_tokens"] == 1900, ended
    wait_until(
        lambda: (
            view(serve.url)["state"] == "inactive"
            and httpx.get(f"{serve.url}/lanes/w", timeout=10).json()["state"] == "ready"
        ),
        120,
        "v stopped and w ready",
    )
    asker.join(120)
    assert waited == [200], waited

    # Every query of docs/grafana/laned.json returns series from what Prometheus scraped
    # (the variables as Grafana's "All"), but the features this CPU host cannot show.
    # The last of the story (w ready, the wait of the request for it) in two scrapes or more,
    # so that a rate() over them has its two points.
    wait_until(
        lambda: prometheus.series('laned_lane_ready{lane="w"} == 1'), 30, "a scrape of w ready"
    )
    wait_until(
        lambda: prometheus.series(
            'count_over_time(laned_proxy_queue_wait_seconds_count{lane="w"}[10s]) >= 2'
        ),
        30,
        "two scrapes of the request's wait",
    )
    empty, left_out = empty_queries(prometheus)
    assert not empty, "dashboard queries without series:\n" + "\n".join(empty)
    print(f"FIGURES real-vllm-dashboard {json.dumps({'left_out': left_out})}")
