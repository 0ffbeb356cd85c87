"""Acceptance gates and the bench against simulator lanes: they pass when the lane is good,
fail with a reason when it is slow or stalled, and say at once when nothing runs."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from laned.adapters.probes import parse_engine_metrics
from laned.core.lanes import EventKind, LaneState
from laned.errors import LaneNotRunning
from laned.validation.load import GATES
from tests.helpers import free_port
from tests.integration.conftest import Harness, Units
from tests.integration.lanes import FAST, lane_config
from tests.integration.test_api import api_server
from tests.integration.test_supervisor import run, supervising, until

# The flags the gates need, as a real lane would have them.
GOOD = (
    FAST
    + 'args = ["--reasoning-parser", "deepseek_v41", "--enable-auto-tool-choice", '
    + '{ flag = "--max-model-len", value = "8192" }]\n'
)
FAST_ENGINE = {"LANED_SIM_DECODE_TPS": "400", "LANED_SIM_PREFILL_TPS": "200000"}


def laned(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "laned", *args], capture_output=True, text=True, timeout=120, env=env
    )


def test_the_six_gates_pass_on_a_good_lane_and_are_kept_shown_and_exported(
    harness: Harness, units: Units, tmp_path: Path
) -> None:
    port, api_port = free_port(), free_port()
    config = lane_config(harness, units, tmp_path, {"a": GOOD}, port, env={"a": FAST_ENGINE})
    base = f"http://127.0.0.1:{api_port}"

    async def scenario() -> None:
        async with (
            api_server(harness, config, api_port) as sup,
            httpx.AsyncClient(base_url=base, timeout=120) as client,
        ):
            await sup.activate("a")
            answer = await client.post("/lanes/a/check")
            assert answer.status_code == 200, answer.text
            run = answer.json()
            assert run["passed"] is True, run
            assert set(run["gates"]) == set(GATES)
            assert run["gates"]["context"]["measured"]["fill"] >= 0.8
            assert run["gates"]["speed"]["measured"]["decode_tok_s"] > 15
            kept = json.loads((Path(config.daemon.state_dir) / "checks" / "a.json").read_text())
            assert kept["config_hash"] == run["config_hash"] and kept["at"] == run["at"]
            view = (await client.get("/lanes/a")).json()
            assert view["checks"]["passed"] is True
            assert view["state"] == "ready"
            # The start's phases come from the journal, which may hand them over late
            # (each late line gives the status a new last_phases: read it each time).
            a = sup.statuses["a"]
            try:
                await until(lambda: "loading weights" in a.last_phases, 20, "the phases")
            except AssertionError as exc:  # what the ledger holds, for a failure on CI
                raise AssertionError(
                    f"{exc}: started {a.started_at}, ready {a.ready_at}, marks {a.phases}"
                ) from None
            metrics = (await client.get("/metrics")).text
            assert 'laned_check_passed{gate="tools",lane="a"} 1.0' in metrics
            assert "laned_check_last_run_timestamp_seconds" in metrics
            assert 'laned_cold_start_phase_seconds{lane="a",phase="loading weights"}' in metrics
            lint = subprocess.run(
                ["promtool", "check", "metrics"], input=metrics, capture_output=True, text=True
            )
            assert lint.returncode == 0, lint.stdout + lint.stderr
            events = [e.reason for e in sup.events if e.kind is EventKind.CHECK]
            assert "tools passed" in events
            # The CLI through the API: a table, exit 0; one gate only.
            out = await asyncio.to_thread(laned, "check", "a", "--url", base, "--gate", "chat")
            assert out.returncode == 0 and "1/1 gates passed" in out.stdout, out
            bad = await client.post("/lanes/a/check", params={"gate": "vibes"})
            assert bad.status_code == 400 and "vibes" in bad.json()["error"]["message"]

    run(scenario())


def test_a_slow_lane_fails_speed_and_is_degraded_but_left_running(
    harness: Harness, units: Units, tmp_path: Path
) -> None:
    port = free_port()
    lane = GOOD + 'checks = { after_activate = ["chat", "speed"], speed_min_tps = 1000 }\n'
    config = lane_config(
        harness,
        units,
        tmp_path,
        {"a": lane},
        port,
        env={"a": {**FAST_ENGINE, "LANED_SIM_DECODE_TPS": "200"}},
    )

    async def scenario() -> None:
        async with supervising(harness, config) as sup:
            await sup.activate("a")
            await until(lambda: sup.statuses["a"].state is LaneState.DEGRADED, 30, "degraded")
            status = sup.statuses["a"]
            assert (
                status.reason.startswith("check speed: decodes at")
                and "below 1000" in status.reason
            )
            speed = status.checks["gates"]["speed"]  # type: ignore[index]
            # Refused by its threshold on what it measured: the simulator decodes 200 a second
            # on an idle machine, fewer on a busy one; either way below 1000.
            measured = speed["measured"]["decode_tok_s"]
            assert not speed["passed"] and 0 < measured < 1000, speed
            # The reason says it to 0.1, the results keep it to 0.01 (201.946 is said 201.9
            # and kept 201.95): the same figure, each as written.
            said = float(status.reason.split("decodes at ")[1].split()[0])
            assert abs(said - measured) <= 0.06, (said, measured)
            assert status.checks["gates"]["chat"]["passed"]  # type: ignore[index]
            assert status.restarts == 0, "a failed check is no reason to restart"
            # Liveness keeps probing the degraded lane (each probe adds a metrics sample) ...
            seen = len(sup.statuses["a"].samples)
            await until(lambda: len(sup.statuses["a"].samples) >= seen + 3, 10, "3 more probes")
            assert sup.statuses["a"].state is LaneState.DEGRADED  # ... and does not restart it
            assert sup.statuses["a"].restarts == 0

    run(scenario())


def test_a_stalled_engine_fails_the_gates_on_their_deadlines(
    harness: Harness, units: Units, tmp_path: Path
) -> None:
    port = free_port()
    lane = GOOD + 'checks = { deadline = "2s" }\n'
    config = lane_config(harness, units, tmp_path, {"a": lane}, port, env={"a": FAST_ENGINE})

    async def scenario() -> None:
        async with supervising(harness, config) as sup:
            await sup.activate("a")
            async with httpx.AsyncClient() as client:
                await client.post(f"http://127.0.0.1:{port}/sim/fault", json={"kind": "stall"})
            started = time.monotonic()
            run_ = await sup.check("a", ["chat", "speed"])
            took = time.monotonic() - started
            for gate in ("chat", "speed"):
                result = run_["gates"][gate]
                assert not result["passed"]
                assert (
                    result["reason"] == "no answer within its 2s deadline (is the engine stalled?)"
                )
            assert took < 30, "the gates must end on their deadlines, not hang"

    run(scenario())


def test_gates_cut_short_by_a_stop_are_not_kept(
    harness: Harness, units: Units, tmp_path: Path
) -> None:
    """A swap or deactivate while the gates run (as when a lane is swapped away right after
    it became ready, with checks.after_activate) says nothing of the engine: no result is
    kept, and no gate is reported failed."""
    port = free_port()
    lane = GOOD + 'checks = { deadline = "60s" }\n'
    config = lane_config(harness, units, tmp_path, {"a": lane}, port, env={"a": FAST_ENGINE})

    async def scenario() -> None:
        async with supervising(harness, config) as sup:
            await sup.activate("a")
            async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as client:
                await client.post("/sim/fault", json={"kind": "stall"})
                checking = asyncio.ensure_future(sup.check("a", ["chat"]))
                # The gate's request has reached the (stalled) engine: the gates are running.
                deadline = time.monotonic() + 10
                while (
                    sample := parse_engine_metrics((await client.get("/metrics")).text)
                ).running + sample.waiting < 1:
                    assert time.monotonic() < deadline, "the chat gate never reached the engine"
                    await asyncio.sleep(0.05)
            await sup.deactivate("a")
            with pytest.raises(LaneNotRunning, match="stopped serving while its gates ran"):
                await asyncio.wait_for(checking, 30)
            assert sup.statuses["a"].checks is None
            assert not [e for e in sup.events if e.kind is EventKind.CHECK]

    run(scenario())


def test_a_lane_that_is_not_running_is_said_at_once(
    harness: Harness, units: Units, tmp_path: Path
) -> None:
    port = free_port()
    config = lane_config(harness, units, tmp_path, {"a": GOOD}, port)

    async def scenario() -> None:
        async with supervising(harness, config) as sup:
            with pytest.raises(LaneNotRunning) as refused:
                await sup.check("a")
            assert "lane a is inactive" in refused.value.message
            assert "laned activate a --wait" in refused.value.hint

    run(scenario())
    out = laned("check", "--base-url", f"http://127.0.0.1:{free_port()}", "--model", "m")
    assert out.returncode == 1 and "the lane is not running" in out.stderr, out


def test_bench_measures_the_configured_decode_rate(start_sim: Any, tmp_path: Path) -> None:
    sim = start_sim(
        "--served-model-name",
        "m",
        "--max-model-len",
        "6000",
        LANED_SIM_DECODE_TPS="250",
        LANED_SIM_PREFILL_TPS="100000",
    )
    out_file = tmp_path / "bench.json"
    out = laned(
        "bench", "--base-url", sim.url, "--model", "m", "--json", "--out", str(out_file),
        "--concurrency", "1,2", "--contexts", "2048,8192",
    )  # fmt: skip
    assert out.returncode == 0, out
    result = json.loads(out.stdout)
    assert json.loads(out_file.read_text()) == result
    assert result["decode_tok_s"]["1"] == pytest.approx(250, rel=0.10)
    assert result["decode_tok_s"]["2"] == pytest.approx(500, rel=0.10)  # aggregate of 2 streams
    assert set(result["prefill_tok_s"]) == {"2048", "5536"}, "8k is capped by the 6000 window"
    assert result["decode_long_context_tok_s"]["5536"] == pytest.approx(250, rel=0.10)
    assert "decode at 2 stream(s)" in out.stderr, "progress while it runs"
