"""bench/cost.py's smoke run: every part runs against the harness and reports its figures
(no timing is asserted: a noisy CI machine says nothing about speed)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import ROOT
from tests.integration.conftest import Harness


def run_bench(harness: Harness, script: str, *args: str) -> subprocess.CompletedProcess[str]:
    """One bench script against the harness; it must end well."""
    result = subprocess.run(
        [sys.executable, script, *args],
        cwd=ROOT, env=harness.env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr[-3000:]
    return result


def test_the_cost_bench_runs_every_part(harness: Harness, tmp_path: Path) -> None:
    out = tmp_path / "cost.json"
    result = run_bench(harness, "bench/cost.py", "--smoke", "--json", str(out))
    figures = json.loads(out.read_text())
    assert (
        figures["scrape"]["page_bytes"] > 200_000 and figures["scrape"]["parse_cpu_ms_median"] > 0
    )
    for lanes in ("2_lanes", "50_lanes"):
        assert figures["footprint"][lanes]["rss_mb"] > 0
    assert figures["scale"]["200_lanes"]["get_lanes_ms"] > 0
    assert "scale, 50 -> 200 lanes" in result.stdout


def test_the_detection_bench_runs(harness: Harness, tmp_path: Path) -> None:
    out = tmp_path / "detection.json"
    run_bench(harness, "bench/detection.py", "--injections", "1", "--dead", "1", "--json", str(out))  # fmt: skip
    figures = json.loads(out.read_text())
    for kind in ("exit 0", "exit 1", "SIGKILL"):
        assert figures[kind]["to_event_ms"]["p50"] > 0
    assert figures["stall"]["to_restart_s"] > 0  # that it ran: no timing is asserted
    assert figures["engine dead"]["to_left_ready_ms"]["p50"] > 0


def test_the_swap_bench_splits_swaps_and_measures_the_floor(
    harness: Harness, tmp_path: Path
) -> None:
    out = tmp_path / "swap.json"
    run_bench(harness, "bench/swap.py", "--smoke", "--startup", "0.3", "--json", str(out))
    figures = json.loads(out.read_text())["exec"]
    laned = figures["laned"]
    # Every part was measured from the engine's own stamps and laned's events.
    for part in ("stop_job", "gate", "start_job", "engine_start", "listen_to_ready"):
        assert laned[part]["p50_ms"] >= 0, part
    assert laned["engine_start"]["p50_ms"] >= 300  # the simulated cold start is inside it
    assert figures["systemd"]["total"]["p50_ms"] > 0 and figures["by_hand"]["total"]["p50_ms"] > 0


def test_the_api_bench_runs_wrk_against_laned_and_the_floor(
    harness: Harness, tmp_path: Path
) -> None:
    out = tmp_path / "api.json"
    run_bench(harness, "bench/api.py", "--smoke", "--json", str(out))
    runs = json.loads(out.read_text())["runs"]
    assert set(runs) == {"GET /lanes c=16", "GET /metrics c=16", "POST /v1/completions c=16"}
    for name, row in runs.items():
        assert row["laned"]["rps"] > 0 and row["floor"]["rps"] > 0, name
        assert row["laned"]["non_2xx"] == 0, name  # laned answered every request


def test_the_token_timing_bench_runs(harness: Harness, tmp_path: Path) -> None:
    out = tmp_path / "token.json"
    run_bench(
        harness, "bench/token_timing.py", "--rounds", "20", "--batch", "50", "--json", str(out)
    )
    figures = json.loads(out.read_text())
    assert set(figures["guard"]) == set(figures["control"]) and len(figures["guard"]) == 4
    for case in (*figures["guard"].values(), *figures["control"].values()):
        assert case["median_ns"] > 0  # that it ran: no timing is asserted on a noisy machine


def test_the_sleep_bench_swaps_back_from_each_rung(harness: Harness, tmp_path: Path) -> None:
    out = tmp_path / "sleep.json"
    args = ("--rounds", "1", "--cold", "0.5", "--weights-gib", "0.2", "--json", str(out))
    result = run_bench(harness, "bench/sleep.py", *args)
    figures = json.loads(out.read_text())
    for rung in ("stopped", "level2", "level1"):
        assert figures[rung]["swap_back_s"]["median"] > 0, rung
    # The sleepers were woken, not started: each has a wake figure, the stopped lane none.
    assert figures["level1"]["last_wake_s"] is not None and figures["stopped"]["last_wake_s"] is None  # fmt: skip
    assert "level1" in result.stdout


def test_the_schedule_bench_runs_both_policies(harness: Harness, tmp_path: Path) -> None:
    out = tmp_path / "schedule.json"
    args = ("--shape", "own", "--turns", "2", "--batch", "2", "--startup", "1")
    result = run_bench(harness, "bench/schedule.py", *args, "--json", str(out))
    figures = json.loads(out.read_text())["results"]
    assert [r["policy"] for r in figures] == ["laned", "fifo"], result.stdout
    for r in figures:
        assert r["swaps"] >= 1 and r["agents"]["completed"] == r["agents"]["sent"] == 4
        assert r["batch"]["completed"] == 2 and r["batch"]["wait_max_s"] is not None


def test_the_latency_bench_follows_each_request_on_both_legs(
    harness: Harness, tmp_path: Path
) -> None:
    if os.geteuid() != 0:
        pytest.skip("the packet capture needs root")
    out = tmp_path / "latency.json"
    args = ("--concurrency", "2", "--requests", "2", "--max-tokens", "20", "--json", str(out))
    run_bench(harness, "bench/proxy_latency.py", *args)
    figures = json.loads(out.read_text())
    # Every request found on both legs, both of laned's parts measured (no timing asserted).
    assert figures["followed"] == figures["requests"] == 4 and figures["lost"] == 0, figures
    assert figures["before_forward_ms"]["p50"] > 0 and figures["first_event_relay_ms"]["p50"] > 0


def test_the_input_limits_bench_runs(harness: Harness, tmp_path: Path) -> None:
    out = tmp_path / "input.json"
    run_bench(harness, "bench/input_limits.py", "--bodies", "2", "--body-mib", "0.5", "--huge-mib", "20", "--slow", "0", "--json", str(out))  # fmt: skip
    figures = json.loads(out.read_text())
    assert figures["over_limit"]["statuses"] == [413], figures  # laned's default limit: 16 MiB
    assert figures["at_limit"]["rss_peak_mib"] > 0
