"""laned against llama.cpp's real `llama-server` (built from source by scripts/install-llamacpp)
serving the suite's tiny model as GGUF, through `laned serve`: its start as laned reads it
from llama-server's own lines, readiness with the key it reads from LLAMA_API_KEY (never
argv), /sd, the /metrics laned reads, the sampling defaults laned passes as its flags, chat
and streams through :9000/v1, a long decode that is not a stall, `laned check` and
`laned bench` counting with its own tokenizer (/apply-template, /tokenize), a wedged decode
loop caught as stalled, the engine killed taken for a failure, both restarted, and a stream
that a swap to a vLLM lane of its group (the simulator) drains, not cuts.

One lane for the whole story: a start costs well under a second here.
"""

from __future__ import annotations

import contextlib
import ctypes
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

from laned.adapters.probes import parse_engine_metrics
from laned.core.phases import Phase
from laned.engines.llamacpp import LLAMACPP, SUMMED
from tests.helpers import argv_holding, free_port, journal, wait_until
from tests.integration.lanes import FAST
from tests.llamacpp.conftest import RealLlamacpp
from tests.reliability.conftest import unit_property

START = 60  # seconds a start of llama-server may take here (well under one)
KEY = "laned-test-key-5f0c1e"
WINDOW = 16384  # each of the two slots' context: 32768 over --parallel 2


def lane_toml(real: RealLlamacpp, secrets: Path) -> str:
    """The lane: the tiny model's trained context (4096) stretched so that a decode runs for
    seconds (--override-kv; a random model does not care), two slots, one thread."""
    command = [
        real.server, "-m", real.model, "-c", "32768", "--parallel", "2", "-t", "1",
        "--override-kv", "llama.context_length=int:32768",
    ]  # fmt: skip
    return (
        'start_timeout = "2m"\nrestart_sec = "1s"\nstop_timeout = "8s"\n'
        'probe = { interval = "1s", stall_after = "2s", start_interval_max = "1s" }\n'
        f'secrets_file = "{secrets}"\n'
        "sampling = { temperature = 0.6, top_k = 40 }\n"
        f"[lanes.l.exec]\ncommand = {json.dumps(command)}\n"
    )


def view(url: str) -> dict[str, Any]:
    return httpx.get(f"{url}/lanes/l", timeout=10).json()  # type: ignore[no-any-return]


def ready_again(url: str, restarts: int) -> dict[str, Any]:
    return wait_until(  # type: ignore[no-any-return]
        lambda: (v := view(url))["state"] == "ready" and v["restarts"] >= restarts and v,
        START,
        f"lane l ready after restart {restarts}",
        interval=0.2,
    )


def events(url: str, since: float) -> list[dict[str, Any]]:
    got = httpx.get(f"{url}/events", params={"lane": "l", "limit": 500}, timeout=10)
    return [e for e in got.json()["events"] if e["at"] >= since]


def server_pid(main_pid: int, binary: str) -> int:
    """The pid of the lane's llama-server, a child of the unit's main process (the wrapper)."""
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            argv0 = (proc / "cmdline").read_bytes().split(b"\0")[0].decode()
            stat = (proc / "stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if argv0 == binary and int(stat[1]) == main_pid:
            return int(proc.name)
    raise AssertionError(f"no {binary} under pid {main_pid}")


def post_long(url: str, tokens: int, out: list[int]) -> threading.Thread:
    """A decode of `tokens` tokens straight to the engine, in a thread; its status in `out`."""

    def post() -> None:
        with contextlib.suppress(httpx.HTTPError):
            body = {"model": "l", "prompt": "Wedge", "max_tokens": tokens, "ignore_eos": True}
            headers = {"Authorization": f"Bearer {KEY}"}
            out.append(httpx.post(url, json=body, headers=headers, timeout=300).status_code)

    thread = threading.Thread(target=post, daemon=True)
    thread.start()
    return thread


class Paused:
    """One thread of a process held still through ptrace (PTRACE_SEIZE, PTRACE_INTERRUPT):
    llama-server's decode loop runs in its main thread, so holding it wedges the engine while
    its HTTP threads answer /health and /metrics (SIGSTOP would stop them all)."""

    SEIZE, INTERRUPT, DETACH = 0x4206, 0x4207, 17

    def __init__(self, tid: int) -> None:
        self.libc = ctypes.CDLL(None, use_errno=True)
        self.libc.ptrace.argtypes = [ctypes.c_long, ctypes.c_long, ctypes.c_void_p, ctypes.c_void_p]
        self.tid = tid
        for request in (self.SEIZE, self.INTERRUPT):
            if self.libc.ptrace(request, tid, None, None) != 0:
                raise OSError(ctypes.get_errno(), f"ptrace {request:#x} of {tid}")
        os.waitpid(tid, 0x40000000)  # __WALL: the interrupt's stop has landed

    def release(self) -> None:
        self.libc.ptrace(self.DETACH, self.tid, None, None)


@pytest.mark.timeout(600)
def test_laned_runs_real_llama_server_from_start_to_death(
    daemon: Any, harness: Any, real_llamacpp: RealLlamacpp, tmp_path: Path
) -> None:
    secrets = tmp_path / "l.env"
    secrets.write_text(f"LLAMA_API_KEY={KEY}\n")
    secrets.chmod(0o600)
    port = free_port()
    # l: real llama-server; w: a simulated vLLM lane on the same port (so one group).
    serve = daemon({"l": lane_toml(real_llamacpp, secrets), "w": FAST},
                   daemon_toml='default_lane = "l"\n', ready=0, ports={"l": port, "w": port})  # fmt: skip
    first = ready_again(serve.url, 0)
    unit = first["unit"]
    assert first["engine_name"] == "llamacpp", first

    # Its start, phase by phase, from llama-server's own lines: a start of 50 ms is over
    # before journald hands them over, and they still count for it.
    wanted = {p.value for p in (Phase.LOADING_MODEL, Phase.WEIGHTS_LOADED, Phase.API_SERVER)}
    wait_until(lambda: wanted <= set(view(serve.url)["last_phases"]), 10, "the start's phases")
    # The sampling defaults reached it as its own flags: its /props says so.
    engine = f"http://127.0.0.1:{port}"
    auth = {"Authorization": f"Bearer {KEY}"}
    props = httpx.get(f"{engine}/props", headers=auth, timeout=10).json()
    params = props["default_generation_settings"]["params"]
    assert abs(params["temperature"] - 0.6) < 1e-6 and params["top_k"] == 40, params

    # The key: llama-server asks for it on /v1 (laned's readiness passed with it), and no
    # process on this machine has it in its argv.
    assert httpx.get(f"{engine}/v1/models", timeout=10).status_code == 401
    assert httpx.get(f"{engine}/v1/models", headers=auth, timeout=10).status_code == 200
    assert argv_holding(KEY) == []

    # Service discovery, and every engine metric laned reads exists on the real page.
    targets = httpx.get(f"{serve.url}/sd", timeout=10).json()
    assert any(f"127.0.0.1:{port}" in t for group in targets for t in group["targets"]), targets
    page = httpx.get(f"{engine}/metrics", headers=auth, timeout=10).text
    names = {s.name for f in text_string_to_metric_families(page) for s in f.samples}
    assert set(SUMMED) <= names, set(SUMMED) - names

    # Chat and a stream through laned's OpenAI endpoint (the client's key travels on).
    with httpx.Client(base_url=f"{serve.url}/v1", timeout=120, headers=auth) as client:
        chat = client.post("/chat/completions", json={
            "model": "l", "messages": [{"role": "user", "content": "What is 17 x 23?"}],
            "max_tokens": 16})  # fmt: skip
        assert chat.status_code == 200, chat.text
        assert chat.json()["usage"]["completion_tokens"] > 0
        with client.stream("POST", "/completions", json={
            "model": "l", "prompt": "The quick brown fox", "max_tokens": 16, "stream": True,
            "ignore_eos": True}) as stream:  # fmt: skip
            chunks = [line for line in stream.iter_lines() if line.startswith("data: ")]
        # llama-server sends a token or a few per chunk, and its counts in the last one.
        assert chunks[-1] == "data: [DONE]" and len(chunks) >= 4, chunks[-3:]
        assert json.loads(chunks[-2][6:])["timings"]["predicted_n"] == 16, chunks[-2]
        wait_until(lambda: view(serve.url)["engine"] is not None, 10, "the engine's load")

        # A decode longer than stall_after (2 s) is progress, not a stall: llama-server
        # counts its tokens only when the request ends, its decode steps all along.
        since = time.time()
        started = time.monotonic()
        long = client.post("/completions", json={
            "model": "l", "prompt": "Tools, reasoning, context", "max_tokens": 12000,
            "ignore_eos": True, "temperature": 0})  # fmt: skip
        took = time.monotonic() - started
        assert long.status_code == 200 and long.json()["usage"]["completion_tokens"] == 12000
        assert took > 2, f"the decode took {took:.1f} s: too short to tell progress from a stall"
        print(f'FIGURES real-llamacpp-decode {{"tokens": 12000, "seconds": {took:.2f}}}')
        assert view(serve.url)["state"] == "ready"
        assert not [e for e in events(serve.url, since) if e["to"] in ("degraded", "restarting")]

    # laned check and laned bench, sized by llama-server's own tokenizer and its window.
    def laned(*args: str) -> Any:
        ran = subprocess.run([sys.executable, "-m", "laned", "--config", str(serve.path), *args],
                             env=harness.env, capture_output=True, text=True, timeout=300)  # fmt: skip
        assert ran.stdout.strip(), ran.stderr
        return json.loads(ran.stdout)

    checked = laned("check", "l", "--json")
    gates = checked["gates"]
    assert set(gates) == {"load", "chat", "reasoning", "tools", "context", "speed"}, gates
    context = gates["context"]["measured"]
    assert context["max_model_len"] == WINDOW and 0.7 <= context["fill"] <= 0.85, context
    benched = laned("bench", "l", "--json", "--concurrency", "1,2", "--contexts", "1000,4000")
    assert set(benched["prefill_tok_s"]) and all(v > 0 for v in benched["prefill_tok_s"].values())
    print(f"FIGURES real-llamacpp-check {json.dumps({k: g['passed'] for k, g in gates.items()})}")
    print(f"FIGURES real-llamacpp-bench {json.dumps(benched['prefill_tok_s'])}")

    # A wedged engine: its decode loop held still under a running request. /health still
    # answers; /metrics answers with nothing moving, or not at all (it can wait on the loop),
    # so laned calls it stalled and restarts it.
    main = int(unit_property(harness, "MainPID", unit))
    pid = server_pid(main, real_llamacpp.server)
    since = time.time()
    statuses: list[int] = []
    post_long(f"{engine}/v1/completions", 30000, statuses)

    # Held as soon as the engine itself says the request runs, whether or not laned's last
    # scrape (1 s apart) saw it: scrapes left unanswered for stall_after are a stall even
    # after one that read the engine idle (liveness.StallDetector.unanswered).
    def processing() -> float:
        page = httpx.get(f"{engine}/metrics", headers=auth, timeout=10).text
        return parse_engine_metrics(page, LLAMACPP.metrics).running

    wait_until(lambda: processing() >= 1, 30, "llama-server running the request", 0.05)
    paused = Paused(pid)
    try:
        wait_until(
            lambda: any(e["reason"].startswith("stalled: ") for e in events(serve.url, since)),
            60,
            "laned to call the engine stalled",
            0.2,
        )
        assert httpx.get(f"{engine}/health", timeout=5).status_code == 200
    finally:
        paused.release()
    again = ready_again(serve.url, 1)
    assert again["last_exit"]["verdict"] == "failure", again["last_exit"]
    assert "seen first as stalled: " in again["last_exit"]["reason"], again["last_exit"]

    # The engine killed: a failure, restarted.
    main = int(unit_property(harness, "MainPID", unit))
    since = time.time()
    os.kill(server_pid(main, real_llamacpp.server), signal.SIGKILL)
    again = ready_again(serve.url, 2)
    assert again["last_exit"]["verdict"] == "failure", again["last_exit"]
    assert "signal 9" in again["last_exit"]["reason"], again["last_exit"]
    assert any("(failure)" in e["reason"] for e in events(serve.url, since))

    # A swap to the vLLM lane drains a stream on llama-server: it ends whole, then l stops
    # and w starts.
    ended: list[dict[str, Any]] = []

    def drained() -> None:
        body = {"model": "l", "prompt": "Drain", "max_tokens": 12000, "ignore_eos": True,
                "stream": True, "stream_options": {"include_usage": True}}  # fmt: skip
        with httpx.stream(
            "POST", f"{serve.url}/v1/completions", json=body, timeout=300, headers=auth
        ) as got:
            lines = [line for line in got.iter_lines() if line.startswith("data: ")]
        ended.append({"last": lines[-1], "usage": json.loads(lines[-2][6:]).get("usage")})

    reader = threading.Thread(target=drained)
    reader.start()
    wait_until(
        lambda: int((view(serve.url).get("proxy") or {}).get("in_flight", 0)) >= 1,
        60,
        "a stream in flight on l",
    )
    assert httpx.post(f"{serve.url}/lanes/w/activate", timeout=30).status_code == 202
    reader.join(300)
    assert ended and ended[0]["last"] == "data: [DONE]", ended
    assert ended[0]["usage"]["completion_tokens"] == 12000, ended
    wait_until(
        lambda: (
            view(serve.url)["state"] == "inactive"
            and httpx.get(f"{serve.url}/lanes/w", timeout=10).json()["state"] == "ready"
        ),
        60,
        "l stopped and w ready",
    )
    log = journal(unit, 400)
    assert KEY not in log
