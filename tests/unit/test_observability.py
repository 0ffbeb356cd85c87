"""The surfaces Prometheus and Grafana read: the dashboard names only metrics that laned or
vLLM (as the simulator exports them) really have, and the alert rules pass promtool's check
and its unit tests (series that fire each alert and series that must not)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any, ClassVar

from laned.api.metrics import LanedMetrics
from laned.sim.metrics import Metrics
from laned.sim.sleep import Sleep
from tests.helpers import ROOT

DASHBOARD = ROOT / "docs" / "grafana" / "laned.json"
RULES = ROOT / "docs" / "prometheus" / "laned-rules.yml"
RULE_TESTS = ROOT / "tests" / "prometheus" / "laned-rules.test.yml"
NAME = re.compile(r"\b(laned_[a-z0-9_]+|vllm:[a-z0-9_:]+)")
SUFFIXES = {
    "counter": ("_total", "_created"),
    "histogram": ("_bucket", "_sum", "_count", "_created"),
    "gauge": ("",),
    "info": ("_info",),
}


class NoLanes:
    """A LaneSource with no lane: every family still says its name and type."""

    statuses: ClassVar[dict[str, Any]] = {}

    def engine_summary(self, lane: str) -> None:
        return None

    def engine_info(self, lane: str) -> tuple[str, str]:
        return "vllm", lane

    def proxy_counts(self, lane: str) -> dict[str, int]:
        return {"in_flight": 0, "queued": 0, "oldest_wait": 0.0}

    def rank_view(self, lane: str) -> None:
        return None


def series_names(exposition: str) -> set[str]:
    """Every series name an exposition's families can have (counter x -> x_total, ...)."""
    names = set()
    for line in exposition.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split()
            base = name.removesuffix("_total") if kind == "counter" else name
            names |= {base + suffix for suffix in SUFFIXES.get(kind, ("",))}
    return names


def exported() -> set[str]:
    laned = LanedMetrics()
    laned.attach(NoLanes())  # type: ignore[arg-type]
    engine = Metrics(model_name="m", spec_decode=True, num_spec_tokens=2)
    engine.extra = Sleep(1.0, 2.0, lambda: 0, lambda: None, lambda _: None).metric_lines
    return series_names(laned.render().decode()) | series_names(engine.render())


def dashboard_queries(dashboard: dict[str, Any]) -> list[str]:
    """Every query of the dashboard's panels, and of its variables."""
    panels = [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]
    return panels + [v["definition"] for v in dashboard["templating"]["list"] if "definition" in v]


def test_the_dashboard_is_the_generators_output(tmp_path: Path) -> None:
    out = tmp_path / "laned.json"
    subprocess.run([sys.executable, str(ROOT / "scripts" / "build-grafana-dashboard"), str(out)], check=True)  # fmt: skip
    assert out.read_text() == DASHBOARD.read_text(), "run scripts/build-grafana-dashboard"


def test_the_dashboard_names_only_metrics_that_exist_and_follows_vllms_conventions() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    known = exported()
    queries = dashboard_queries(dashboard)
    assert len(queries) >= 30
    used = {name for query in queries for name in NAME.findall(query)}
    assert used - known == set(), f"queries name metrics nobody exports: {sorted(used - known)}"
    # And the dashboard covers what the issues ask for.
    for needed in (
        "laned_lane_state", "laned_swap_duration_seconds_bucket", "laned_cold_start_phase_seconds",
        "laned_restarts_total", "laned_engine_exits_total", "laned_lane_stalls_total",
        "laned_check_passed", "vllm:generation_tokens_total", "vllm:num_requests_running",
        "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc", "vllm:engine_sleep_state",
        "vllm:time_to_first_token_seconds_bucket", "laned_requests_queued",
        "laned_schedule_swaps_total", "laned_requests_oldest_wait_seconds",
    ):  # fmt: skip
        assert needed in used, needed
    # vLLM's conventions: its variables, rates over $__rate_interval, its thresholds.
    names = [v["name"] for v in dashboard["templating"]["list"]]
    assert {"job", "instance", "model_name", "lane"} <= set(names), names
    for query in queries:
        if "rate(" in query:
            assert "[$__rate_interval]" in query and not re.search(r"\[\d+[smh]\]", query), query
    steps = {
        p["title"]: [s["value"] for s in p["fieldConfig"]["defaults"]["thresholds"]["steps"]]
        for p in dashboard["panels"]
        if "thresholds" in p.get("fieldConfig", {}).get("defaults", {})
    }
    assert steps == {"KV-cache use": [None, 0.9, 0.98], "Error ratio (5xx)": [None, 0.001, 0.01]}


def test_the_alert_rules_name_only_metrics_that_exist() -> None:
    known = exported()
    used = set(NAME.findall(RULES.read_text()))
    assert used and used - known == set(), sorted(used - known)


def test_promtool_checks_the_rules_and_runs_their_tests() -> None:
    promtool = shutil.which("promtool")
    assert promtool, "promtool is missing (apt-get install prometheus)"
    check = subprocess.run([promtool, "check", "rules", str(RULES)], capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr
    assert "SUCCESS: 9 rules found" in check.stdout
    tests = subprocess.run(
        [promtool, "test", "rules", str(RULE_TESTS)], capture_output=True, text=True
    )
    assert tests.returncode == 0, tests.stdout + tests.stderr


def test_promtool_finds_laneds_metrics_clean() -> None:
    """`promtool check metrics` (Prometheus' own lint of names, units and types) over a
    scrape where every family has samples."""
    from laned.core.lanes import LaneStatus

    class OneLane(NoLanes):
        statuses: ClassVar[dict[str, Any]] = {"a": LaneStatus("a")}

    metrics = LanedMetrics()
    metrics.attach(OneLane())  # type: ignore[arg-type]
    metrics.swap("none", "a", "ready", 3.0)
    metrics.cold_start("a", 3.0)
    metrics.sleep_mode("a", "wake", 1.0)
    metrics.exit("a", 0, None, "failure")
    metrics.canary_mismatch("a", "wake")
    metrics.reload("applied")
    metrics.gpu_gate("a", True, 0.1)
    metrics.proxy_answer("a", 200)
    metrics.proxy_queue_wait("a", 1.0)
    metrics.proxy_overhead("a", 0.001)
    metrics.schedule_swap("a", "idle")
    page = metrics.render().decode()
    assert "laned_restarts_total" in page and "laned_requests_queued" in page
    promtool = shutil.which("promtool")
    assert promtool, "promtool is missing (apt-get install prometheus)"
    check = subprocess.run([promtool, "check", "metrics"], input=page, capture_output=True, text=True)  # fmt: skip
    assert check.returncode == 0 and not check.stdout.strip(), check.stdout + check.stderr


def test_metrics_are_rendered_again_after_a_change_and_only_then() -> None:
    from laned.core.lanes import LaneStatus

    class OneLane(NoLanes):
        statuses: ClassVar[dict[str, Any]] = {"a": LaneStatus("a")}

    metrics = LanedMetrics()
    metrics.attach(OneLane())  # type: ignore[arg-type]
    first = metrics.render()
    assert metrics._rendered is not None
    kept = metrics._rendered
    assert metrics.render() == first and metrics._rendered is kept  # nothing new: not again
    metrics.restart("a", "failure")  # every change goes through a recorder method
    page = metrics.render().decode()
    assert metrics._rendered is not kept
    assert 'laned_restarts_total{lane="a",reason="failure"} 1.0' in page
