"""The control API on a real uvicorn server over the real supervisor, and the CLI over it."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from laned.adapters.host import Host
from laned.adapters.podman import Podman
from laned.adapters.probes import Probe
from laned.adapters.systemd import Systemd
from laned.api import ApiSettings, create_app
from laned.api.front import Front
from laned.api.metrics import LanedMetrics
from laned.daemon import api_server as http_server
from laned.daemon import api_settings
from laned.errors import LanedError
from laned.owner.supervisor import Supervisor
from laned.owner.wiring import host_seam
from laned.validation.load import parse_config
from tests.helpers import ROOT, free_port
from tests.integration.conftest import Harness, Units
from tests.integration.lanes import FAST, lane_config
from tests.integration.test_supervisor import until


def envelope(response: httpx.Response, status: int, code: str) -> dict[str, Any]:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert error["code"] == code and error["message"] and "hint" in error
    return error  # type: ignore[no-any-return]


@contextlib.asynccontextmanager
async def api_server(
    harness: Harness,
    config: Any,
    api_port: int,
    token: str | None = None,
    token_for_reads: bool = False,
    host: Host | None = None,
) -> AsyncIterator[Supervisor]:
    """A started supervisor with its API on 127.0.0.1:api_port (with `host`: preflight, GPU
    gate, podman)."""
    sup = Supervisor(config, host_seam(Systemd(harness.bus), Probe(), host), systemd_version=252)
    metrics = LanedMetrics()
    sup.recorder = metrics
    front = Front(sup)
    metrics.attach(front)
    await sup.start()
    settings = ApiSettings("127.0.0.1", api_port, token, token_for_reads)
    server = http_server(create_app(front, settings, metrics), settings)
    task = asyncio.get_running_loop().create_task(server.serve())
    try:
        while not server.started:
            await asyncio.sleep(0.02)
        yield sup
    finally:
        server.stop()
        await task
        await sup.close()
        await sup.seam.close()


def test_api_end_to_end(harness: Harness, units: Units, tmp_path: Path) -> None:
    port, api_port = free_port(), free_port()
    config = lane_config(harness, units, tmp_path, {"a": FAST, "b": FAST}, port)
    token_file = tmp_path / "token"
    token_file.write_text("s3cret-token\n")
    token_file.chmod(0o600)

    async def scenario() -> None:
        base = f"http://127.0.0.1:{api_port}"
        auth = {"Authorization": "Bearer s3cret-token"}
        async with (
            api_server(harness, config, api_port, token="s3cret-token") as sup,
            httpx.AsyncClient(base_url=base, timeout=60) as client,
        ):
            assert (await client.get("/healthz")).json()["status"] == "ok"
            lanes = (await client.get("/lanes")).json()["lanes"]
            assert [lane["name"] for lane in lanes] == ["a", "b"]
            assert lanes[0]["base_url"] == f"http://127.0.0.1:{port}/v1"
            envelope(await client.get("/lanes/nope"), 404, "unknown-lane")
            envelope(await client.get("/lanes/nope/activate", headers=auth), 404, "unknown-lane")
            envelope(
                await client.get("/lanes/a/activate?timeout=-1", headers=auth),
                400,
                "bad-request",
            )
            envelope(
                await client.get("/lanes/a/activate?wait=maybe", headers=auth),
                400,
                "bad-request",
            )
            envelope(await client.get("/lanes/a/restart", headers=auth), 405, "method-not-allowed")
            envelope(await client.get("/nowhere"), 404, "not-found")
            # Safe by default: token, rebinding and cross-site refusals; reads stay open.
            envelope(await client.get("/lanes/a/activate"), 401, "unauthorized")
            envelope(
                await client.get("/lanes/a/activate", headers={"Authorization": "Bearer nope"}),
                403,
                "forbidden",
            )
            envelope(
                await client.get("/lanes", headers={"Host": "evil.example:9000"}),
                403,
                "forbidden-host",
            )
            envelope(
                await client.post(
                    "/lanes/a/activate", headers={**auth, "Origin": "http://evil.example"}
                ),
                403,
                "cross-site",
            )
            envelope(
                await client.get(
                    "/lanes/a/activate", headers={**auth, "Sec-Fetch-Site": "cross-site"}
                ),
                403,
                "cross-site",
            )
            # The path as an attacker spells it (Starlette's `$` matches before a trailing
            # newline), from another site, without the token; rank_only in FastAPI's other
            # spellings with laned's token but not the peer's. Sent as written, by curl.
            for crafted, headers in (
                ("/lanes/a/activate%0A?force=true", ["-H", "Origin: http://evil.example", "-H", "Sec-Fetch-Site: cross-site"]),
                ("/lanes/a/activate%0a", []),
                ("/lanes/a%0A/activate", []),
                ("/lanes/a/activate?rank_only=yes", ["-H", "Authorization: Bearer s3cret-token"]),
                ("/lanes/a/activate?rank%5Fonly=true", ["-H", "Authorization: Bearer s3cret-token"]),
            ):  # fmt: skip
                sent = await asyncio.to_thread(
                    subprocess.run,
                    ["curl", "-s", "-o", "/dev/null", "-w", "%{http_code}", *headers, base + crafted],
                    capture_output=True, text=True, timeout=30,
                )  # fmt: skip
                assert sent.stdout in ("400", "403"), (crafted, sent.stdout)
            assert sup.statuses["a"].desired.value == "inactive", (
                "refused requests must change nothing"
            )
            accepted = await client.get("/lanes/a/activate", headers=auth)
            assert accepted.status_code == 202 and accepted.json()["name"] == "a"
            ready = await client.post("/lanes/a/activate?wait=true&timeout=60", headers=auth)
            assert ready.status_code == 200 and ready.json()["state"] == "ready"
            # The line people type, with the token.
            curl = await asyncio.to_thread(
                subprocess.run,
                ["curl", "-s", "-H", "Authorization: Bearer s3cret-token", f"{base}/lanes/b/activate?wait=true"],
                capture_output=True, text=True, timeout=60,
            )  # fmt: skip
            assert '"state":"ready"' in curl.stdout and '"name":"b"' in curl.stdout
            assert sup.statuses["a"].state.value == "inactive"
            # The CLI over the API.
            env = {**os.environ, "LANED_CONFIG": str(tmp_path / "laned.toml")}
            cli = [sys.executable, "-m", "laned"]
            status = await asyncio.to_thread(
                subprocess.run,
                [*cli, "status", "--url", base],
                capture_output=True,
                text=True,
                env=env,
            )
            assert status.returncode == 0 and "ready" in status.stdout and "LANE" in status.stdout
            activated = await asyncio.to_thread(
                subprocess.run,
                [*cli, "activate", "a", "--wait", "--url", base, "--token-file", str(token_file)],
                capture_output=True, text=True, env=env, timeout=60,
            )  # fmt: skip
            assert activated.returncode == 0 and activated.stdout.startswith("a: ready"), (
                activated.stderr
            )
            refused = await asyncio.to_thread(
                subprocess.run,
                [*cli, "deactivate", "a", "--url", base],
                capture_output=True,
                text=True,
                env=env,
            )
            assert refused.returncode == 1 and "bearer token" in refused.stderr
            # Without --wait: accepted, and the line says so (not only "a: ready").
            accepted_cli = await asyncio.to_thread(
                subprocess.run,
                [*cli, "deactivate", "a", "--url", base, "--token-file", str(token_file)],
                capture_output=True, text=True, env=env, timeout=60,
            )  # fmt: skip
            assert accepted_cli.returncode == 0, accepted_cli.stderr
            assert accepted_cli.stdout.startswith("a: deactivate accepted; "), accepted_cli.stdout
            assert "desired inactive" in accepted_cli.stdout, accepted_cli.stdout
            await until(lambda: sup.statuses["a"].state.value == "inactive", 30, "a stopped")
            events = (await client.get("/events?lane=b")).json()["events"]
            assert events[-1]["to"] == "inactive" and any(e["to"] == "ready" for e in events)
            # Metrics and service discovery, readable without the token.
            await client.get("/lanes/b/activate?wait=true", headers=auth)
            sd = (await client.get("/sd")).json()
            assert sd == [
                {
                    "targets": [f"127.0.0.1:{port}"],
                    "labels": {
                        "lane": "b",
                        "model": "b",
                        "unit": f"{units.name('b')}.service",
                        "engine": "vllm",
                    },
                }
            ]
            exposition = (await client.get("/metrics")).text
            assert 'laned_lane_state{lane="b",state="ready"} 1.0' in exposition
            assert 'laned_lane_info{engine="vllm",lane="b",model="b"} 1.0' in exposition
            assert 'laned_lane_ready{lane="a"} 0.0' in exposition
            assert 'laned_swaps_total{from_lane="a",result="ready",to_lane="b"}' in exposition
            assert "superseded" not in exposition  # a second activate joins the first
            assert 'laned_engine_exits_total{code="0",lane="a",verdict="requested"}' in exposition
            assert (
                "laned_cold_start_duration_seconds_bucket" in exposition
                and "laned_build_info" in exposition
            )
            promtool = await asyncio.to_thread(
                subprocess.run,
                ["promtool", "check", "metrics"],
                input=exposition,
                capture_output=True,
                text=True,
            )
            assert promtool.returncode == 0, promtool.stdout + promtool.stderr
            stopped = await client.post("/lanes/a/deactivate?wait=true", headers=auth)
            assert stopped.status_code == 200 and stopped.json()["state"] == "inactive"

    asyncio.run(asyncio.wait_for(scenario(), 120))


def test_the_door_answers_lanes_and_metrics_as_their_routes_do(
    harness: Harness, units: Units, tmp_path: Path
) -> None:
    """GET /lanes and GET /metrics are answered by laned.api.door before FastAPI's router:
    the same status, content type and content as the routes behind it give, the guard first."""
    port = free_port()
    config = lane_config(harness, units, tmp_path, {"a": FAST, "b": FAST}, port)

    async def scenario() -> None:
        sup = Supervisor(config, host_seam(Systemd(harness.bus), Probe()), systemd_version=252)
        metrics = LanedMetrics()
        sup.recorder = metrics
        front = Front(sup)
        metrics.attach(front)
        await sup.start()
        app = create_app(front, ApiSettings("127.0.0.1", 9000, "t0k", True), metrics)
        headers = {"Authorization": "Bearer t0k", "Host": "localhost:9000"}
        try:
            await asyncio.wait_for(await front.activate("a", False), 60)
            for path in ("/lanes", "/metrics"):
                answers = []
                for asgi in (app, app.behind):
                    transport = httpx.ASGITransport(app=asgi)
                    async with httpx.AsyncClient(transport=transport, base_url="http://localhost:9000") as client:  # fmt: skip
                        answers.append(await client.get(path, headers=headers))
                door, route = answers
                assert door.status_code == route.status_code == 200, path
                assert door.headers["content-type"] == route.headers["content-type"], path
                assert door.headers["content-length"] == str(len(door.content)), path
                if path == "/lanes":
                    assert door.json() == route.json()
                    assert door.json()["lanes"][0]["base_url"] == f"http://localhost:{port}/v1"
                else:  # the same series (their values move with each request)
                    names = [{line.split(" ")[0].split("{")[0] for line in a.text.splitlines()} for a in answers]  # fmt: skip
                    assert names[0] == names[1] and "laned_lane_state" in names[0]
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://localhost:9000") as client:  # fmt: skip
                refused = await client.get("/lanes", headers={"Host": "localhost:9000"})
                assert refused.status_code == 401, "the door answered before the guard"

            def broken() -> list[str]:
                raise RuntimeError("a bug")

            front.notices = broken  # type: ignore[method-assign]
            transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
            async with httpx.AsyncClient(transport=transport, base_url="http://localhost:9000") as client:  # fmt: skip
                failed = await client.get("/lanes", headers=headers)
                assert failed.status_code == 500 and failed.json()["error"]["code"] == "internal"
        finally:
            await sup.close()
            await sup.seam.close()

    asyncio.run(scenario())


def test_serve_is_safe_by_default(tmp_path: Path) -> None:
    base = (
        '[lanes.a]\nport = 8001\nserved_model_name = "m"\n[lanes.a.exec]\ncommand = ["/bin/true"]\n'
    )
    env = {"HOME": str(tmp_path)}
    open_listen = parse_config('[daemon]\nlisten = "0.0.0.0:9000"\n' + base, "t", env)
    with pytest.raises(LanedError, match="reachable from other machines") as info:
        api_settings(open_listen)
    assert "token_file" in info.value.hint
    token = tmp_path / "token"
    token.write_text("t0k\n")
    token.chmod(0o644)
    loose = parse_config(
        f'[daemon]\nlisten = "0.0.0.0:9000"\ntoken_file = "{token}"\n' + base, "t", env
    )
    with pytest.raises(LanedError, match="others can read the token"):
        api_settings(loose)
    token.chmod(0o600)
    settings = api_settings(loose)
    assert settings.token == "t0k" and settings.listen_host == "0.0.0.0"
    assert api_settings(parse_config(base, "t", env)).token is None  # loopback: no token needed


def test_prometheus_scrapes_laned_and_discovers_the_engine(
    harness: Harness, units: Units, tmp_path: Path
) -> None:
    import shutil

    prometheus = shutil.which("prometheus")
    assert prometheus, "prometheus is missing (apt-get install prometheus)"
    port, api_port, prom_port = free_port(), free_port(), free_port()
    config = lane_config(harness, units, tmp_path, {"a": FAST}, port)
    (tmp_path / "prometheus.yml").write_text(
        "global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
        "scrape_configs:\n"
        f"  - job_name: laned\n    static_configs: [{{targets: ['127.0.0.1:{api_port}']}}]\n"
        f"  - job_name: engines\n    http_sd_configs: [{{url: 'http://127.0.0.1:{api_port}/sd', refresh_interval: 1s}}]\n"
    )

    async def query(client: httpx.AsyncClient, expr: str) -> list[dict[str, Any]]:
        try:
            body = (
                await client.get(
                    f"http://127.0.0.1:{prom_port}/api/v1/query", params={"query": expr}
                )
            ).json()
        except (httpx.HTTPError, ValueError):
            return []
        return list(body.get("data", {}).get("result", []))

    async def scenario() -> None:
        with (tmp_path / "prometheus.log").open("w") as log:
            prom = subprocess.Popen(
                [prometheus, f"--config.file={tmp_path / 'prometheus.yml'}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                 f"--web.listen-address=127.0.0.1:{prom_port}"],
                stdout=log, stderr=log,
            )  # fmt: skip
        try:
            async with (
                api_server(harness, config, api_port) as sup,
                httpx.AsyncClient(timeout=5) as client,
            ):
                await sup.activate("a")
                deadline = asyncio.get_running_loop().time() + 60
                while True:
                    ready = await query(client, 'laned_lane_ready{lane="a"}')
                    engine = await query(client, 'vllm:num_requests_running{job="engines"}')
                    if ready and engine:
                        break
                    assert asyncio.get_running_loop().time() < deadline, (
                        tmp_path / "prometheus.log"
                    ).read_text()[-2000:]
                    await asyncio.sleep(0.5)
                assert ready[0]["value"][1] == "1"
                assert engine[0]["metric"]["lane"] == "a" and engine[0]["metric"]["model"] == "a"
                assert engine[0]["metric"]["unit"] == f"{units.name('a')}.service"
        finally:
            prom.terminate()
            prom.wait(20)

    asyncio.run(asyncio.wait_for(scenario(), 120))


def test_events_follow_logs_and_the_cli(harness: Harness, units: Units, tmp_path: Path) -> None:
    port, api_port = free_port(), free_port()
    config = lane_config(harness, units, tmp_path, {"a": FAST}, port)
    base = f"http://127.0.0.1:{api_port}"

    async def scenario() -> None:
        async with (
            api_server(harness, config, api_port),
            httpx.AsyncClient(base_url=base, timeout=60) as client,
        ):
            seen: list[dict[str, Any]] = []
            following = asyncio.Event()

            async def follow() -> None:
                async with client.stream(
                    "GET", "/events", params={"follow": "true", "lane": "a"}
                ) as response:
                    assert response.headers["content-type"].startswith("text/event-stream")
                    async for line in response.aiter_lines():
                        if line.startswith(": following"):
                            following.set()
                        if line.startswith("data: "):
                            seen.append(json.loads(line[6:]))
                            if seen[-1]["to"] == "ready":
                                return

            follower = asyncio.get_running_loop().create_task(follow())
            await asyncio.wait_for(following.wait(), 10)  # subscribed before the activation
            await client.get("/lanes/a/activate?wait=true")
            await asyncio.wait_for(follower, 30)
            assert [e["to"] for e in seen] == ["starting", "ready"]
            lines = (await client.get("/lanes/a/logs?lines=50")).json()["lines"]
            assert any("Application startup complete." in line for line in lines)
            env = {**os.environ, "LANED_CONFIG": str(tmp_path / "laned.toml")}
            shown = await asyncio.to_thread(
                subprocess.run,
                [sys.executable, "-m", "laned", "events", "--url", base],
                capture_output=True,
                text=True,
                env=env,
            )
            assert shown.returncode == 0 and "a: starting -> ready" in shown.stdout
            logs = await asyncio.to_thread(
                subprocess.run, [sys.executable, "-m", "laned", "logs", "a", "-n", "5", "--url", base],
                capture_output=True, text=True, env=env,
            )  # fmt: skip
            assert logs.returncode == 0 and len(logs.stdout.splitlines()) == 5
            unknown = await asyncio.to_thread(
                subprocess.run,
                [sys.executable, "-m", "laned", "logs", "zz", "--url", base],
                capture_output=True,
                text=True,
                env=env,
            )
            assert unknown.returncode == 1 and "no lane named 'zz'" in unknown.stderr

    asyncio.run(asyncio.wait_for(scenario(), 120))


def test_reload_applies_good_configs_and_refuses_bad_ones(
    harness: Harness, units: Units, tmp_path: Path
) -> None:
    port, api_port = free_port(), free_port()
    config = lane_config(harness, units, tmp_path, {"a": FAST}, port)
    path = tmp_path / "laned.toml"
    good = path.read_text()
    base = f"http://127.0.0.1:{api_port}"
    units.track(f"{units.name('b')}.service")

    async def scenario() -> None:
        async with (
            api_server(harness, config, api_port) as sup,
            httpx.AsyncClient(base_url=base, timeout=60) as client,
        ):
            await client.get("/lanes/a/activate?wait=true")
            path.write_text(good.replace("served_model_name", "served_modle_name", 1))
            bad = await client.post("/reload")
            error = envelope(bad, 400, "bad-config")
            assert "lanes.a.served_modle_name: unknown key" in error["message"]
            path.write_text(good.split("[lanes.a]")[0])
            refused = envelope(await client.post("/reload"), 409, "reload-refused")
            assert "deactivate it before removing it" in refused["hint"]
            assert sup.statuses["a"].state.value == "ready", "a refused reload must disturb nothing"
            b = (
                good.split("[lanes.a]")[1]
                .replace("[lanes.a.", "[lanes.b.")
                .replace(units.name("a"), units.name("b"))
                .replace('"a"', '"b"')
                .replace("/models/a", "/models/b")
            )
            # A key the running lane's next start applies (stop_timeout, once used here, is
            # applied live: systemd takes a running unit's new TimeoutStopSec= at once).
            changed = (
                good.replace('restart_sec = "200ms"', 'restart_sec = "300ms"', 1) + "[lanes.b]" + b
            )
            path.write_text(changed)
            applied = await client.post("/reload")
            assert applied.status_code == 200, applied.text
            assert applied.json()["restart_needed"] == ["a"]
            assert [lane["name"] for lane in (await client.get("/lanes")).json()["lanes"]] == [
                "a",
                "b",
            ]
            assert (harness.unit_dir / f"{units.name('b')}.service").exists()
            ready_b = await client.get("/lanes/b/activate?wait=true")
            assert ready_b.json()["state"] == "ready"
            assert (
                'laned_config_reloads_total{result="applied"} 1.0'
                in (await client.get("/metrics")).text
            )

    asyncio.run(asyncio.wait_for(scenario(), 120))


def test_schemathesis_finds_no_server_error(harness: Harness, units: Units, tmp_path: Path) -> None:
    import shutil
    import threading

    schemathesis = shutil.which("schemathesis") or str(Path(sys.executable).parent / "schemathesis")
    port, api_port = free_port(), free_port()
    # A lane that fails at once (crash loop after one failure): fuzzed activations end fast.
    config = lane_config(harness, units, tmp_path, {"x": 'start_limit_burst = 1\nstart_timeout = "5s"\n'}, port,
                         env={"x": {"LANED_SIM_FAIL_AT_START": "3"}})  # fmt: skip
    ready = threading.Event()
    stop = threading.Event()

    async def serve() -> None:
        host = Host(Podman(harness.env["LANED_PODMAN_SOCKET"]))
        async with api_server(harness, config, api_port, host=host):
            ready.set()
            while not stop.is_set():
                await asyncio.sleep(0.05)
        host.close()

    thread = threading.Thread(target=lambda: asyncio.run(serve()), daemon=True)
    thread.start()
    try:
        assert ready.wait(30), "the API did not come up"
        result = subprocess.run(
            # Every phase, the stateful one too (it follows GET /lanes to lane x). laned's own
            # check (schemathesis_hooks.py) tells its documented 502/503/504 answers — a
            # lane that crashes, a wait shorter than the start — from a server error.
            [schemathesis, "run", f"http://127.0.0.1:{api_port}/openapi.json", "--checks", "laned_server_error",
             "--max-examples", "15", "--exclude-path", "/events", "--request-timeout", "30", "--no-color"],
            capture_output=True, text=True, timeout=300,
            cwd=tmp_path,  # its cache stays out of the checkout
            env={**os.environ, "SCHEMATHESIS_HOOKS": "tests.integration.schemathesis_hooks", "PYTHONPATH": str(ROOT)},
        )  # fmt: skip
        assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    finally:
        stop.set()
        thread.join(60)


def test_restart_failures_timeouts_and_reads_behind_the_token(
    harness: Harness, units: Units, tmp_path: Path
) -> None:
    port, api_port = free_port(), free_port()
    lanes = {"a": FAST, "f": FAST + "start_limit_burst = 1\n"}
    config = lane_config(
        harness, units, tmp_path, lanes, port, env={"f": {"LANED_SIM_FAIL_AT_START": "3"}}
    )
    base = f"http://127.0.0.1:{api_port}"
    auth = {"Authorization": "Bearer tok"}

    async def scenario() -> None:
        async with (
            api_server(harness, config, api_port, token="tok", token_for_reads=True),
            httpx.AsyncClient(base_url=base, timeout=60) as client,
        ):
            envelope(await client.get("/lanes"), 401, "unauthorized")
            envelope(await client.get("/metrics"), 401, "unauthorized")
            assert (await client.get("/healthz")).status_code == 200
            assert (await client.get("/lanes/a/activate?wait=true", headers=auth)).json()[
                "state"
            ] == "ready"
            restarted = await client.post("/lanes/a/restart?wait=true", headers=auth)
            assert restarted.status_code == 200 and restarted.json()["restarts"] == 1
            failed = envelope(
                await client.post("/lanes/f/activate?wait=true", headers=auth),
                502,
                "activation-failed",
            )
            assert "crash-loop" in failed["message"]
            late = envelope(
                await client.post("/lanes/a/activate?wait=true&timeout=0.05", headers=auth),
                504,
                "timeout",
            )
            assert "it goes on" in late["hint"]
            assert (await client.post("/lanes/a/activate?wait=true", headers=auth)).json()[
                "state"
            ] == "ready"

    asyncio.run(asyncio.wait_for(scenario(), 120))


def test_preflight_fit_and_refusals_through_the_api_and_the_cli(
    harness: Harness, units: Units, sim_image: str, tmp_path: Path
) -> None:
    port, api_port = free_port(), free_port()
    ctr = units.name("ctr-b")
    units.containers.append(ctr)
    lanes = {
        "a": FAST + "needs = { host_memory_gib = 1 }\n",
        "b": FAST
        + "needs = { host_memory_gib = 100000 }\n"
        + f'[lanes.b.container]\nimage = "localhost/laned-never-built:1"\nname = "{ctr}"\n'
        + 'command = ["serve", "/models/b"]\nnetwork = "host"\n',
    }
    config = lane_config(harness, units, tmp_path, lanes, port)
    base = f"http://127.0.0.1:{api_port}"
    cli = [sys.executable, "-m", "laned", "--config", str(tmp_path / "laned.toml")]
    host = Host(Podman(harness.env["LANED_PODMAN_SOCKET"]))

    def laned(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*cli, *args], capture_output=True, text=True, timeout=60, env=harness.env
        )

    async def scenario() -> None:
        async with (
            api_server(harness, config, api_port, host=host) as sup,
            httpx.AsyncClient(base_url=base, timeout=60) as client,
        ):
            assert (
                await client.get("/lanes/a/activate", params={"wait": "true"})
            ).status_code == 200
            # The start's phases come from the journal, which may hand them over after the
            # engine answered (docs/supervisor.md): waited for, with a deadline.
            await until(lambda: sup.statuses["a"].last_phases, 10, "the start's phases")
            shown = (await client.get("/lanes/a")).json()
            assert shown["last_phases"] and shown["container"] is None
            body = (await client.get("/lanes/b/preflight")).json()
            assert body["ok"] is False
            errors = {f["check"] for f in body["findings"] if f["severity"] == "error"}
            assert errors == {"image", "needs"}, body
            # An activation preflight refuses answers 409 with the findings, and a keeps running.
            refused = await client.post("/lanes/b/activate", params={"wait": "true"})
            assert refused.status_code == 409
            error = refused.json()["error"]
            assert error["code"] == "preflight-failed" and "not present locally" in error["message"]
            assert any(f["check"] == "image" for f in error["findings"])
            assert sup.statuses["a"].state.value == "ready"
            fit = (await client.get("/fit")).json()
            assert fit["host"]["gpus"] is None and "NVML" in fit["host"]["gpu_note"]
            verdicts = {lane["name"]: lane["fits"] for lane in fit["lanes"]}
            assert verdicts == {"a": True, "b": False}
            view = (await client.get("/lanes/b")).json()
            assert view["container"] == {"name": ctr, "status": "absent"}
            # The CLI over the same API.
            url = ["--url", base]
            out = await asyncio.to_thread(laned, "preflight", "b", *url)
            assert out.returncode == 1 and "refused: 2 error(s)" in out.stdout, out
            assert "podman build" in out.stdout
            out = await asyncio.to_thread(laned, "status", "--fit", *url)
            assert out.returncode == 0 and "does not fit" in out.stdout, out
            out = await asyncio.to_thread(laned, "activate", "b", *url, "--wait")
            assert out.returncode == 1 and "preflight" in out.stderr, out
        # laned is gone: preflight still answers, computed here.
        out = await asyncio.to_thread(laned, "preflight", "a", "--url", "http://127.0.0.1:1")
        assert out.returncode == 0 and "checking here" in out.stderr and "ok" in out.stdout, out

    try:
        asyncio.run(asyncio.wait_for(scenario(), 120))
    finally:
        host.close()
