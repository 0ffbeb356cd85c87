"""Engines that misbehave without exiting, each ending in its documented state within its
timeout (docs/supervisor.md): one that never opens its port and one that opens it but never
lists its model on /v1/models end `failed("start-timeout")` with their unit stopped; one whose
/health flaps stays `ready` while fewer than `probe.failures` probes fail in a row, and is
`degraded` and restarted when that many do."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

import httpx

from tests.helpers import free_port, wait_until
from tests.integration.conftest import Harness
from tests.reliability.conftest import figures, unit_property

# A stand-in engine: /health answers by FLAP (1 = 200, 0 = 500, in turn; not 503, which a vLLM
# lane's health rule takes for its engine's death: laned.engines.vllm HEALTH), /v1/models lists
# the served name unless MODELS=none. It takes the flags laned appends (--port, --served-model-name).
ENGINE = """
import http.server, itertools, json, os, sys
args = sys.argv[1:]
port, name = int(args[args.index("--port") + 1]), args[args.index("--served-model-name") + 1]
flap = itertools.cycle(os.environ.get("FLAP", "1").split(","))
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        if self.path == "/health":
            self.send_response(200 if next(flap) == "1" else 500); self.end_headers()
        elif self.path == "/v1/models" and os.environ.get("MODELS") != "none":
            body = json.dumps({"data": [{"id": name}]}).encode()
            self.send_response(200); self.send_header("Content-Length", str(len(body)))
            self.end_headers(); self.wfile.write(body)
        else:
            self.send_response(404); self.end_headers()
    def log_message(self, *a): pass
http.server.ThreadingHTTPServer(("0.0.0.0", port), H).serve_forever()
"""
PROBE = 'probe = { interval = "200ms", failures = 3, start_interval_min = "50ms", start_interval_max = "200ms" }\n'


def lane(tmp: Path, command: list[str], env: dict[str, str], extra: str = "") -> str:
    words = ", ".join(f'"{w}"' for w in command)
    table = "".join(f'{k} = "{v}"\n' for k, v in env.items())
    return f'{PROBE}restart_sec = "200ms"\n{extra}[lanes.X.exec]\ncommand = [{words}]\n[lanes.X.env]\n{table}'


def view(url: str, name: str) -> dict[str, Any]:
    return dict(httpx.get(f"{url}/lanes/{name}", timeout=10).json())


def test_engines_that_never_serve_fail_at_their_start_timeout(
    harness: Harness, daemon: Any, tmp_path: Path
) -> None:
    engine = tmp_path / "engine.py"
    engine.write_text(ENGINE)
    timeout = 'start_timeout = "3s"\n'
    lanes = {
        "closed": lane(tmp_path, ["/bin/sh", "-c", "exec sleep 3600", "sh"], {}, timeout),
        "nomodels": lane(tmp_path, [sys.executable, str(engine)], {"MODELS": "none"}, timeout),
    }
    lanes = {name: text.replace("[lanes.X.", f"[lanes.{name}.") for name, text in lanes.items()}
    ports = {"closed": free_port(), "nomodels": free_port()}
    serve = daemon(lanes, ready=0, ports=ports)
    took = {}
    for name in lanes:
        start = time.monotonic()
        reply = httpx.post(
            f"{serve.url}/lanes/{name}/activate", params={"wait": "true"}, timeout=60
        )
        took[name] = round(time.monotonic() - start, 2)
        assert reply.status_code == 502, reply.text
        seen = view(serve.url, name)
        assert seen["state"] == "failed" and "start-timeout" in seen["reason"], seen
        unit = next(u for u in serve.units if u.endswith(f"-{name}.service"))
        assert wait_until(
            lambda u=unit: unit_property(harness, "ActiveState", u) in ("inactive", "failed"),
            20,
            f"{unit} stopped",
        )
    figures(
        "never-serving",
        failed_start_timeout=sorted(lanes),
        seconds_to_failed=took,
        start_timeout_s=3,
    )


def test_a_flapping_health_is_tolerated_below_the_limit_and_restarted_at_it(
    daemon: Any, tmp_path: Path
) -> None:
    engine = tmp_path / "engine.py"
    engine.write_text(ENGINE)
    lanes = {
        "flaps": lane(
            tmp_path, [sys.executable, str(engine)], {"FLAP": "1,1,0,0"}
        ),  # 2 in a row at most
        "fails": lane(
            tmp_path, [sys.executable, str(engine)], {"FLAP": "1,1,0,0,0,0"}
        ),  # 4 in a row
    }
    lanes = {name: text.replace("[lanes.X.", f"[lanes.{name}.") for name, text in lanes.items()}
    ports = {"flaps": free_port(), "fails": free_port()}
    serve = daemon(
        {n: t.replace(PROBE, PROBE + f'group = "{n}"\ngpus = []\n') for n, t in lanes.items()},
        ready=0,
        ports=ports,
    )
    for name in lanes:
        assert (
            httpx.post(
                f"{serve.url}/lanes/{name}/activate", params={"wait": "true"}, timeout=60
            ).status_code
            == 200
        )
    wait_until(
        lambda: view(serve.url, "fails")["restarts"] >= 2 or None,
        30,
        "the failing lane restarted twice",
    )
    events = httpx.get(
        f"{serve.url}/events", params={"lane": "fails", "limit": 500}, timeout=10
    ).json()["events"]
    degraded = [
        e for e in events if e["to"] == "degraded" and "consecutive probe failures" in e["reason"]
    ]
    assert len(degraded) >= 2
    flaps = view(serve.url, "flaps")  # some 20 probes, half of them failed, by now
    assert flaps["state"] == "ready" and flaps["restarts"] == 0, flaps
    figures("flapping-health", below_limit={"state": flaps["state"], "restarts": flaps["restarts"]},
            at_limit={"degraded_events": len(degraded), "restarts": view(serve.url, "fails")["restarts"]})  # fmt: skip
